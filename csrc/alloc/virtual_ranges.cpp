// VirtualRanges implementation.
//
// Owns: growing virtual space and unmapping cached ranges.
// Invariants: those of virtual_ranges.hpp.
#include "alloc/virtual_ranges.hpp"

#include <algorithm>
#include <map>
#include <utility>

namespace vta {

bool VirtualRanges::take_cached_page(uintptr_t* va, size_t* bytes) {
  uintptr_t start = 0;
  size_t range = 0;
  if (!cached_.smallest(&start, &range)) return false;
  int32_t last = pages_.page_at(start + range - pages_.page_bytes());
  VTA_INVARIANT(last >= 0 && pages_.address_of(last) >= start);
  *va = pages_.address_of(last);
  *bytes = pages_.bytes_of(last);
  bool taken = cached_.take_exact(*va, *bytes);
  VTA_INVARIANT(taken);
  return true;
}

bool VirtualRanges::take_growable(size_t bytes, uintptr_t* start, size_t* cached) {
  // Largest cached range first: the most pages kept in place.
  const std::map<uintptr_t, size_t>& free_va = unmapped_.ranges();
  uintptr_t best = 0;
  size_t best_bytes = 0;
  for (auto& [at, n] : cached_.ranges()) {
    if (n >= bytes || n <= best_bytes) continue;
    auto next = free_va.find(at + n);
    if (next == free_va.end() || next->second < bytes - n) continue;
    // The same reservation: the range must not cross its end.
    auto res = pages_.reservations().upper_bound(at);
    VTA_INVARIANT(res != pages_.reservations().begin());
    --res;
    if (at + bytes > res->first + res->second) continue;
    best = at;
    best_bytes = n;
  }
  if (!best_bytes) return false;
  bool taken = cached_.take_exact(best, best_bytes) && unmapped_.take_exact(best + best_bytes, bytes - best_bytes);
  VTA_INVARIANT(taken);
  *start = best;
  *cached = best_bytes;
  return true;
}

bool VirtualRanges::take_cached_extent(uint32_t npages, uintptr_t* va) {
  uint64_t bytes = uint64_t{npages} * pages_.page_bytes();
  bool found = false;
  pages_.for_each_mapped_extent([&](int32_t id, uintptr_t at) {
    if (found || pages_.pages_of(id) != npages || !cached_.contains(at, bytes)) return;
    found = cached_.take_exact(at, bytes);
    *va = at;
  });
  return found;
}

void VirtualRanges::unmap(uintptr_t va, size_t bytes) {
  pages_.unmap_range(va, bytes);
  unmapped_.insert(va, bytes);
}

void VirtualRanges::unmap_cached() {
  std::vector<std::pair<uintptr_t, size_t>> cached(cached_.ranges().begin(), cached_.ranges().end());
  for (auto& [start, bytes] : cached) {
    cached_.take_exact(start, bytes);
    unmap(start, bytes);
  }
}

void VirtualRanges::grow(size_t min_bytes) {
  size_t page = pages_.page_bytes();
  size_t bytes = std::max<size_t>(reservation_bytes_, (min_bytes + page - 1) / page * page);
  uintptr_t va = pages_.reserve(bytes);
  for (RangeSet* set : {&cached_, &unmapped_}) {
    set->add_fence(va);
    set->add_fence(va + bytes);
  }
  unmapped_.insert(va, bytes);
}

void VirtualRanges::clear() {
  cached_.clear();
  unmapped_.clear();
}

}  // namespace vta
