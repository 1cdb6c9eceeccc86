// RestoreWindow: mapped mode's window for restores, where a device handle is filled while the
// virtual pages it will back still show their host copy.
//
// Owns: one virtual reservation (made on first use, twice the device capacity: room for
// handles of mixed sizes), the ranges of it not in use, and the mapping of a restore's device
// handle at a range of it (map, set access; unmap). Only the copy stream uses a window address,
// so its mappings change without a quiesce. (The host slots' own window is the HostPool's.)
// Invariants: a range is taken by at most one restore; what take() hands out goes back
// through unmap() or abandon(), or with the whole window at close(); after close() nothing is
// reserved. Every call is made under the address space's lock.
#pragma once

#include <cstdint>

#include "backend/backend.hpp"
#include "vmm/range_set.hpp"

namespace vta {

class RestoreWindow {
 public:
  RestoreWindow(Backend& backend, size_t page_bytes, uint64_t capacity)
      : backend_(backend), page_bytes_(page_bytes), capacity_(capacity) {}
  RestoreWindow(const RestoreWindow&) = delete;
  RestoreWindow& operator=(const RestoreWindow&) = delete;

  // A free range of `bytes`, reserving the window on the first call; throws (out of memory:
  // "restore window is full") when no range is free.
  uintptr_t take(uint64_t bytes);
  // Map `handle` at the taken range `at` and grant access; *mapped is set once the map call
  // succeeded (the caller then unmaps on failure). Throws.
  void map(uintptr_t at, uint64_t bytes, PageHandle handle, bool* mapped);
  // Unmap the handle at `at` and give the range back; throws when the unmap fails (the range
  // stays taken).
  void unmap(uintptr_t at, uint64_t bytes);
  // After a failure: unmap the handle at `at` if `mapped` (errors ignored) and give the range back.
  void abandon(uintptr_t at, uint64_t bytes, bool mapped);
  // close(): unmap one handle still at `at` (its range goes with the window), then give back the
  // window. Each returns its error.
  Status unmap_at_close(uintptr_t at, uint64_t bytes) { return backend_.unmap(at, bytes); }
  Status close();

 private:
  Backend& backend_;
  size_t page_bytes_;
  uint64_t capacity_;
  uintptr_t window_ = 0;  // the reservation
  size_t window_bytes_ = 0;
  RangeSet free_;  // its unused addresses
};

}  // namespace vta
