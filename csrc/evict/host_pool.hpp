// HostPool: where evicted pages' bytes live, bounded by host_capacity, allocated once, reused.
//
// Owns: page-sized host slots of one of two kinds, chosen by the eviction mode:
//  - copy mode: slots carved from pinned host memory (cuMemHostAlloc on cuda, plain memory
//    on host), allocated in chunks as needed and kept until close: no per-evict pinning and
//    no power-of-two rounding (a slot is exactly one page);
//  - mapped mode: host-located VMM pages (CUDA HOST_NUMA; memfds on the host backend), each
//    also mapped at its own address in a "window" reservation so copies can reach it while
//    it is not mapped at the evicted page's address.
// Invariant: used slots * page_bytes <= capacity; after release_all() nothing is held.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"

namespace vta {

class HostPool {
 public:
  struct Slot {
    uintptr_t addr = 0;    // where the bytes can be copied to/from
    PageHandle page = 0;   // mapped mode: the host-located page handle (0 in copy mode)
  };

  HostPool(Backend& backend, size_t page_bytes, uint64_t capacity_bytes, bool mapped);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A free slot; false when the pool is at capacity. Throws on driver errors.
  bool acquire(Slot* out);
  void release(const Slot& slot);
  void release_all();

  bool mapped() const { return mapped_; }
  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t held_bytes() const { return held_; }  // pinned or created so far
  uint64_t used_bytes() const { return used_ * page_; }

 private:
  bool grow();

  Backend& backend_;
  size_t page_;
  uint64_t capacity_;
  bool mapped_;
  uint64_t held_ = 0;
  uint64_t used_ = 0;
  std::vector<Slot> free_;
  std::vector<std::pair<void*, size_t>> chunks_;  // copy mode: pinned chunks
  std::vector<Slot> pages_;                        // mapped mode: every host page created
  uintptr_t window_ = 0;                           // mapped mode: window reservation
  size_t window_bytes_ = 0;
};

}  // namespace vta
