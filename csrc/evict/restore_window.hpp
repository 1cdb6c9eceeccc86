// RestoreWindow: mapped mode's window for restores, where a device handle is filled while the
// virtual pages it will back still show their host copy.
//
// Owns: which ranges of its window are in use, one restore's each. The window (a reservation
// made on first use, twice the device capacity: room for handles of mixed sizes) and the
// mapping of a restore's device handle at a range of it are the PageTable's, which owns every
// reservation and mapping: this asks it (reserve_window, map_side, unmap_side, free_window) and
// calls no backend. Only the copy stream uses a window address, so its mappings change without
// a quiesce. (The host slots' own window is the HostPool's.)
// Invariants: a range is taken by at most one restore; what take() hands out goes back
// through unmap() or abandon(), or with the whole window at close(); a range goes back only once
// nothing is mapped at it; after close() nothing is reserved. Every call is made under the
// address space's lock.
#pragma once

#include <cstdint>

#include "vmm/page_table.hpp"
#include "vmm/range_set.hpp"

namespace vta {

class RestoreWindow {
 public:
  RestoreWindow(PageTable& pages, uint64_t capacity) : pages_(pages), capacity_(capacity) {}
  RestoreWindow(const RestoreWindow&) = delete;
  RestoreWindow& operator=(const RestoreWindow&) = delete;

  // A free range of `bytes`, reserving the window on the first call; throws (out of memory:
  // "restore window is full") when no range is free.
  uintptr_t take(uint64_t bytes);
  // Map the device handle `handle` at the taken range `at` and grant access, all or nothing
  // (PageTable::map_side). Throws.
  void map(uintptr_t at, uint64_t bytes, PageHandle handle);
  // Unmap the handle at `at` and give the range back; throws when the unmap fails (the range
  // stays taken).
  void unmap(uintptr_t at, uint64_t bytes);
  // After a failure: unmap the handle at `at` if `mapped` (errors ignored) and give the range
  // back (kept taken if the unmap was refused).
  void abandon(uintptr_t at, uint64_t bytes, bool mapped);
  // close(): unmap one handle still at `at` (its range goes with the window), then give back the
  // window. Each returns its error.
  Status unmap_at_close(uintptr_t at, uint64_t bytes) { return pages_.unmap_side(at, bytes); }
  Status close();

 private:
  PageTable& pages_;
  uint64_t capacity_;
  uintptr_t window_ = 0;  // the window (the page table's)
  size_t window_bytes_ = 0;
  RangeSet free_;  // its unused addresses
};

}  // namespace vta
