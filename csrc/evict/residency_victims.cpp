// Victim choice: which resident pages may be evicted under pressure, and the eviction of one
// (see residency.hpp).
//
// Owns: the engine's answer to free_device_page (release held pages, finish the evictions still
// copying, evict a victim, give back a prefetched restore's page), which pages are victim
// candidates (their order is the VictimPolicy's), and that none comes from the range the caller
// keeps.
// Invariants: those of residency.hpp; a page is a victim candidate only while it is resident, mapped
// and every allocation on it is marked evictable; a victim is a whole handle, every allocation
// on which is marked evictable; pages of the range free_device_page keeps (the allocation being
// made resident, or the block being placed) are never chosen as victims.
#include "evict/residency.hpp"

namespace vta {

// A resident, evictable page is a candidate, used now; anything else is not one.
void Residency::note_page(uintptr_t va) {
  if (away_.first_of(va) || pages_.page_at(va) < 0 || !facts_.evictable(va, page_bytes_)) {
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

bool Residency::free_device_page(bool may_evict, uintptr_t keep_lo, uintptr_t keep_hi) {
  if (release_evicted()) return true;
  if (finish_evictions()) return true;  // copies still running: their pages are next
  if (!may_evict) return false;
  Kept kept{page_of(keep_lo), keep_hi};
  if (evict_victim(kept)) return true;
  return give_back_prefetched(kept);
}

// Restores made ahead of need (a prefetch for later) hold device pages that nothing waits for
// yet: their bytes are still in the host slot, so when nothing else can free a page, one of them
// goes back to evicted and its device page is free. Never those being made resident now (kept).
bool Residency::give_back_prefetched(const Kept& kept) {
  auto vas = away_.where([&](const AwayPage& p) {
    return (p.state == State::restoring || p.state == State::restored) && p.device_page >= 0;
  });
  for (uintptr_t va : vas) {
    if (kept.overlaps(va, bytes_of(away_.at(va)))) continue;
    finish_inflight(va, true);  // a copy still running completes first
    AwayPage* p = away_.find(va);
    if (!p) return true;  // copy mode: resident now, a victim candidate like any other
    if (p->state != State::restored) continue;
    unrestore(*p);
    return true;
  }
  return false;
}

bool Residency::evict_victim(const Kept& kept) {
  bool evicted = false;
  victims_->visit([&](uintptr_t va) {
    int32_t id = pages_.page_at(va);  // the whole handle is the victim
    uintptr_t h = pages_.address_of(id);
    uint64_t hb = pages_.bytes_of(id);
    if (kept.overlaps(h, hb)) return false;  // under the allocation being made resident, or the block being placed
    if (hb > page_bytes_ && !facts_.evictable(h, hb)) return false;  // another page of it holds data that must stay
    uint32_t npages = pages_.pages_of(id);
    if (!evict_page(va, true)) return true;  // host pool full: stop, nothing evicted
    counters_.pressure_evicted(npages);  // counted in pages, as evictions are
    evicted = true;
    return true;
  });
  return evicted;
}

}  // namespace vta
