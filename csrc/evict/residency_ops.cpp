// Residency operations over an allocation's pages, and victim choice (see residency.hpp).
//
// Owns: what the address space asks of the engine for one live allocation (offload,
// prefetch, ensure resident, residency, reads and writes that reach the bytes wherever they
// are), which resident pages are victim candidates (their order is the VictimPolicy's) and the
// eviction of a victim under pressure, and the eviction fields of the stats.
// Invariants: those of residency.hpp; a page is a victim candidate only while it is resident, mapped
// and every allocation on it is marked evictable; a victim is a whole handle, every allocation
// on which is marked evictable; pages of the pinned range (pin_lo_, pin_hi_: the allocation
// being made resident, or the block being placed) are never chosen as victims.
#include <algorithm>
#include <string>

#include "evict/residency.hpp"

namespace vta {

// A resident, evictable page is a candidate, used now; anything else is not one.
void Residency::note_page(uintptr_t va) {
  if (away_first(va) || pages_.page_at(va) < 0 || !users_.evictable(va, page_bytes_)) {
    victims_->forget(va);
    return;
  }
  victims_->note_use(va);
}

void Residency::note_use(uintptr_t start, uint64_t bytes) {
  for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_) note_page(va);
}

// The pages strictly between the first and the last lie under this allocation alone, so none
// is a candidate once it left: note_use() would forget each; forget_range() does it at once.
// Same calls, same order (first page, the pages between, last page): the LRU order is unchanged.
void Residency::note_left(uintptr_t start, uint64_t bytes) {
  uintptr_t first = page_of(start), last = page_of(start + bytes - 1);
  note_page(first);
  if (last > first + page_bytes_) victims_->forget_range(first + page_bytes_, last);
  if (last != first) note_page(last);
}

bool Residency::free_device_page(bool may_evict) {
  if (release_evicted()) return true;
  if (finish_evictions()) return true;  // copies still running: their pages are next
  if (!may_evict) return false;
  if (evict_victim()) return true;
  return give_back_prefetched();
}

// Restores made ahead of need (a prefetch for later) hold device pages that nothing waits for
// yet: their bytes are still in the host slot, so when nothing else can free a page, one of them
// goes back to evicted and its device page is free. Never those being made resident now (pin).
bool Residency::give_back_prefetched() {
  auto vas = away_where([&](const AwayPage& p) {
    return (p.state == State::restoring || p.state == State::restored) && p.device_page >= 0;
  });
  for (uintptr_t va : vas) {
    if (pinned(va, bytes_of(away_.at(va)))) continue;
    finish_inflight(va, true);  // a copy still running completes first
    auto it = away_.find(va);
    if (it == away_.end()) return true;  // copy mode: resident now, a victim candidate like any other
    if (it->second.state != State::restored) continue;
    unrestore(it->second);
    return true;
  }
  return false;
}

bool Residency::evict_victim() {
  bool evicted = false;
  victims_->visit([&](uintptr_t va) {
    int32_t id = pages_.page_at(va);  // the whole handle is the victim
    uintptr_t h = pages_.address_of(id);
    uint64_t hb = pages_.bytes_of(id);
    if (pinned(h, hb)) return false;  // under the allocation being made resident, or the block being placed
    if (hb > page_bytes_ && !users_.evictable(h, hb)) return false;  // another page of it holds data that must stay
    uint32_t npages = pages_.pages_of(id);
    if (!evict_page(va, true)) return true;  // host pool full: stop, nothing evicted
    counters_.pressure_evictions += npages;  // counted in pages, as evictions are
    evicted = true;
    return true;
  });
  return evicted;
}

void Residency::finish_restore(uintptr_t start, uint64_t bytes) {
  auto t0 = Clock::now();
  bool waited = false, swap = false;
  for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_) {
    if (!away_first(va)) continue;
    waited = true;
    finish_inflight(va, true);
    const AwayPage* p = away_at(va);
    swap = swap || (p && p->state == State::restored);
  }
  if (swap) swap_restored();  // one wait for every restored page, these included
  if (waited) counters_.restore_wait_ns += ns_since(t0);
  note_use(start, bytes);
}

uint64_t Residency::offload(uintptr_t start, uint64_t bytes) {
  // Handle by handle: one shared with an allocation not marked evictable stays resident.
  uint64_t end = start + bytes;
  bool kept_back = false;
  for (uintptr_t va = page_of(start); va < end;) {
    uintptr_t first = 0;
    uint64_t span = 0;
    if (away_span(va, &first, &span)) {
      finish_inflight(first, true);  // a restore still running completes first
      auto it = away_.find(first);
      if (it != away_.end() && it->second.state == State::restored) unrestore(it->second);
      if (away_.count(first)) {  // evicting or evicted
        va = first + span;
        continue;
      }
    }
    int32_t id = pages_.page_at(va);
    VTA_INVARIANT(id >= 0);
    uintptr_t h = pages_.address_of(id);
    uint64_t hb = pages_.bytes_of(id);
    if (!users_.evictable(h, hb, start)) {
      kept_back = true;
    } else if (!evict_page(h, false)) {
      fail(VTA_ERR_HOST_POOL_EXHAUSTED, "host pool exhausted: " + std::to_string(host_pool_->used_bytes()) + " of " +
                                            std::to_string(host_pool_->capacity_bytes()) +
                                            " bytes hold evicted pages (raise host_capacity)");
    }
    va = h + hb;
  }
  uint64_t moved = away_bytes(start, bytes);
  if (moved == 0 && kept_back)
    fail(VTA_ERR_INVALID_ARGUMENT, "cannot offload: every page of this allocation is shared with an allocation "
                                   "not marked evictable (mark both with set_evictable)");
  return moved;
}

uint64_t Residency::away_bytes(uintptr_t start, uint64_t bytes) const {
  uint64_t n = 0, end = start + bytes;
  for (uintptr_t va = page_of(start); va < end;) {
    uintptr_t first = 0;
    uint64_t span = 0;
    if (!away_span(va, &first, &span)) {
      va += page_bytes_;
      continue;
    }
    n += std::min<uint64_t>(end, first + span) - std::max<uint64_t>(start, first);
    va = first + span;
  }
  return n;
}

int Residency::residency_of(uintptr_t start, uint64_t bytes) const {
  bool evicted = false;
  for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_) {
    const AwayPage* p = away_at(va);
    if (!p) continue;
    if (p->state != State::evicted) return VTA_IN_FLIGHT;
    evicted = true;
  }
  return evicted ? VTA_EVICTED : VTA_RESIDENT;
}

// Copy between [va, va + n) and host memory without restoring anything: resident pages,
// host-mapped evicted pages and restored pages not yet swapped in are reached at their
// address, copy-mode evicted ones in their host slot; in-flight pages are waited for first.
// A write to an evicted page whose device page is still held goes to both copies; a write to
// a restored page swaps it in first (the device copy would go stale otherwise).
void Residency::copy_bytes(uintptr_t va, uintptr_t host, uint64_t n, StreamHandle stream, bool to_va) {
  uintptr_t at = va;
  while (at < va + n) {
    uintptr_t page = page_of(at);
    uint64_t chunk = std::min<uint64_t>(page + page_bytes_, va + n) - at;
    uintptr_t target = at, also = 0;
    if (away_first(page)) {
      finish_inflight(page, true);
      const AwayPage* q = away_at(page);
      if (q && to_va && q->state == State::restored) swap_restored();
      uintptr_t first = 0;
      q = away_at(page, &first);
      if (q) {
        const AwayPage& p = *q;
        uintptr_t slot = host_pool_->address_at(p.slots, at - first);  // a page never crosses two slots
        if (p.state == State::evicted && p.device_held) {
          if (to_va) also = slot;
        } else if (!p.host_mapped) {
          target = slot;
        }
      }
    }
    uintptr_t h = host + (at - va);
    check(to_va ? backend_.copy(target, h, chunk, stream) : backend_.copy(h, target, chunk, stream));
    if (also) check(backend_.copy(also, h, chunk, stream));
    at += chunk;
  }
  check(backend_.stream_synchronize(stream));
}

void Residency::fill_stats(vta_stats_t* s) const {
  s->evict_mode = mapped_mode_ ? VTA_EVICT_MAPPED : VTA_EVICT_COPY;
  uint64_t evicted = 0, held = 0, restored = 0;  // in pages
  for (auto& [va, p] : away_) {
    if (p.state == State::evicted) evicted += p.npages;
    if (p.state == State::evicted && p.device_held) held += p.npages;
    if (p.state == State::restored) restored += p.npages;
  }
  s->pages_evicted = evicted;
  s->pages_in_flight = in_flight_ + restored;
  s->evicted_bytes = evicted * page_bytes_;
  // Held device pages of evicted pages are mapped but hold no resident data of their own.
  s->pages_resident -= held;
  s->host_pool_capacity_bytes = host_capacity_;
  s->host_pool_bytes = host_pool_ ? host_pool_->held_bytes() : 0;
  s->host_pool_used_bytes = host_pool_used_bytes();
  s->evictions = counters_.evictions;
  s->pressure_evictions = counters_.pressure_evictions;
  s->bytes_evicted_total = counters_.bytes_evicted_total;
  s->evict_copy_ns = counters_.evict_copy_ns;
  s->restores = counters_.restores;
  s->bytes_restored_total = counters_.bytes_restored_total;
  s->restore_copy_ns = counters_.restore_copy_ns;
  s->restore_wait_ns = counters_.restore_wait_ns;
}

}  // namespace vta
