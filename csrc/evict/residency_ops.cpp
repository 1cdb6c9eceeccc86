// Residency operations over one live allocation's pages (see residency.hpp).
//
// Owns: what the address space asks of the engine for one live allocation: offload, the steps
// of a restore (begin, next away page, finish), its residency and away bytes, reads and writes
// that reach its bytes wherever they are; and the eviction fields of the stats.
// Invariants: those of residency.hpp; an allocation's pages are walked in address order, one
// away page (a handle's pages) at a time; a restore begins by taking back, with no copy, the
// pages whose device page was never released, and never frees device memory from the
// allocation it restores (free_device_page keeps it).
#include <algorithm>
#include <string>

#include "evict/residency.hpp"

namespace vta {

void Residency::begin_restore(uintptr_t start, uint64_t bytes) {
  // Pages whose device page was never released come back first, for free: restoring the
  // others may need memory, and must not release these to get it.
  std::vector<uintptr_t> held;
  for_each_away(start, bytes, [&](uintptr_t first, const AwayPage& p) {
    if (p.state == State::evicted && p.device_held) held.push_back(first);
    return true;
  });
  for (uintptr_t first : held) unevict_held(first);
}

bool Residency::next_to_restore(uintptr_t* cursor, uintptr_t end, StreamHandle consumer, uintptr_t* first,
                                uint32_t* npages) {
  for (uintptr_t page = page_of(*cursor); page < end;) {
    uintptr_t va = away_.first_of(page);
    if (!va) {
      page += page_bytes_;
      continue;
    }
    if (away_.at(va).state == State::evicting) finish_inflight(va, true);
    AwayPage& q = away_.at(va);
    if (q.paused) fail(VTA_ERR_PAUSED, "the page at " + std::to_string(va) + " belongs to a paused region: resume it first");
    uintptr_t next = va + bytes_of(q);
    if (q.state == State::restoring || q.state == State::restored) {
      if (std::find(q.consumers.begin(), q.consumers.end(), consumer) == q.consumers.end()) {
        if (q.state == State::restoring) check(order_.consumer_after(consumer, q.event));
        q.consumers.push_back(consumer);
      }
      page = next;
      continue;
    }
    if (q.device_held) {  // evicted while this restore obtained memory for another page
      unevict_held(va);
      page = next;
      continue;
    }
    *cursor = next;
    *first = va;
    *npages = q.npages;
    return true;
  }
  *cursor = end;
  return false;
}

void Residency::finish_restore(uintptr_t start, uint64_t bytes) {
  auto t0 = Clock::now();
  bool waited = false, swap = false;
  for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_) {
    if (!away_.first_of(va)) continue;
    waited = true;
    finish_inflight(va, true);
    const AwayPage* p = away_at(va);
    swap = swap || (p && p->state == State::restored);
  }
  if (swap) swap_restored();  // one wait for every restored page, these included
  if (waited) counters_.waited(t0);
  note_use(start, bytes);
}

uint64_t Residency::offload(uintptr_t start, uint64_t bytes) {
  // Handle by handle: one shared with an allocation not marked evictable stays resident.
  bool kept_back = false;
  for_each_handle_to_move(
      start, bytes, [](uintptr_t) {},  // evicting or evicted already
      [&](int32_t, uintptr_t h, uint64_t hb) {
        if (!facts_.evictable(h, hb, start)) {
          kept_back = true;
        } else if (!evict_page(h, false)) {
          fail(VTA_ERR_HOST_POOL_EXHAUSTED, "host pool exhausted: " + std::to_string(host_pool_.used_bytes()) +
                                                " of " + std::to_string(host_pool_.capacity_bytes()) +
                                                " bytes hold evicted pages (raise host_capacity)");
        }
      });
  uint64_t moved = away_bytes(start, bytes);
  if (moved == 0 && kept_back)
    fail(VTA_ERR_INVALID_ARGUMENT, "cannot offload: every page of this allocation is shared with an allocation "
                                   "not marked evictable (mark both with set_evictable)");
  return moved;
}

uint64_t Residency::away_bytes(uintptr_t start, uint64_t bytes) const {
  uint64_t n = 0, end = start + bytes;
  for_each_away(start, bytes, [&](uintptr_t first, const AwayPage& p) {
    n += std::min<uint64_t>(end, first + bytes_of(p)) - std::max<uint64_t>(start, first);
    return true;
  });
  return n;
}

bool Residency::settled_away(uintptr_t va, uintptr_t* first, uint64_t* span) {
  if (!away_span(va, first, span)) return false;
  finish_inflight(*first, true);  // an eviction or a restore still copying completes first
  AwayPage* p = away_.find(*first);
  if (p && p->state == State::restored) unrestore(*p);
  return away_.starts_at(*first);
}

int Residency::residency_of(uintptr_t start, uint64_t bytes) const {
  if (paused_over(start, bytes)) return VTA_PAUSED;
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
    if (away_.first_of(page)) {
      finish_inflight(page, true);
      const AwayPage* q = away_at(page);
      if (q && to_va && q->state == State::restored) swap_restored();
      uintptr_t first = 0;
      q = away_at(page, &first);
      if (q && q->paused) fail(VTA_ERR_PAUSED, "these bytes belong to a paused region: resume it first");
      if (q) {
        const AwayPage& p = *q;
        uintptr_t slot = host_pool_.address_at(p.slots, at - first);  // a page never crosses two slots
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
  away_.count(&evicted, &held, &restored);
  s->pages_evicted = evicted;
  s->pages_in_flight = in_flight_ + restored;
  s->evicted_bytes = evicted * page_bytes_;
  // Held device pages of evicted pages are mapped but hold no resident data of their own.
  s->pages_resident -= held;
  s->host_pool_capacity_bytes = host_pool_.capacity_bytes();
  s->host_pool_bytes = host_pool_.held_bytes();
  s->host_pool_used_bytes = host_pool_used_bytes();
  counters_.fill(s);
}

}  // namespace vta
