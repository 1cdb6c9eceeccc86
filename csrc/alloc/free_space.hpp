// FreeSpace: the free virtual bytes of one address space, and the growth of its virtual space.
//
// Owns: every free virtual byte, in 512-byte-granular ranges, whatever is mapped under them (a
// free range may lie over cached handles, over the free part of a shared page, and over
// unmapped pages alike), and the reservations made to grow the space.
// Invariants: a free range never crosses a reservation edge (the set fences at every
// reservation's edges); a byte of a reservation is either free here or under exactly one block
// (a live or kept allocation, a pending free, or a free waiting for recorded streams); take() is
// best fit: the smallest range in which the caller's placement finds room.
#pragma once

#include <cstdint>

#include "backend/status.hpp"
#include "vmm/page_table.hpp"
#include "vmm/range_set.hpp"

namespace vta {

class FreeSpace {
 public:
  FreeSpace(PageTable& pages, uint64_t reservation_bytes) : pages_(pages), reservation_bytes_(reservation_bytes) {}
  FreeSpace(const FreeSpace&) = delete;
  FreeSpace& operator=(const FreeSpace&) = delete;

  // Best fit: the smallest free range of at most `most` bytes in which place(start, size) names
  // a position for `bytes` (0: none there), taken out; false when none has one (nothing changed).
  template <typename Place>
  bool take(uint64_t bytes, Place&& place, uintptr_t* out, uint64_t most = UINT64_MAX) {
    return free_.take_best_fit_placed(bytes, place, out, most);
  }
  // Visit the free ranges of at least `bytes`, smallest first, while f(start, size) returns true.
  template <typename F>
  void for_each_fitting(uint64_t bytes, F&& f) const {
    free_.for_each_at_least(bytes, f);
  }
  // Take exactly [va, va + bytes), which must be free.
  void take_exact(uintptr_t va, uint64_t bytes) {
    bool taken = free_.take_exact(va, bytes);
    VTA_INVARIANT(taken);
  }
  // [va, va + bytes) is free again (merged with its free neighbours in the same reservation).
  void give(uintptr_t va, uint64_t bytes) { free_.insert(va, bytes); }
  bool is_free(uintptr_t va, uint64_t bytes) const { return free_.contains(va, bytes); }
  // Reserve at least min_bytes more virtual space (one reservation of the configured size or
  // larger, page-aligned), all of it free. Throws on a driver failure.
  void grow(uint64_t min_bytes);
  uint64_t free_bytes() const { return free_.total_bytes(); }
  void clear() { free_.clear(); }

 private:
  PageTable& pages_;
  uint64_t reservation_bytes_;
  RangeSet free_;
};

}  // namespace vta
