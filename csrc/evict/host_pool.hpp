// HostPool: where evicted pages' bytes live, bounded by host_capacity, allocated once, reused.
//
// Owns: host slots, each a run of one or more page-sized pieces that hold the bytes of one
// away handle (a page, or an extent of several: one slot and one copy when a run of its size
// is free; in copy mode several slots and copies when not), of one of two kinds,
// chosen by the eviction mode:
//  - copy mode: slots carved best-fit from pinned host memory (cuMemHostAlloc on cuda, plain
//    memory on host), allocated in chunks of at least 64 MiB as needed and kept until close
//    (a chunk with nothing in it is given back when a larger slot needs the room): no
//    per-evict pinning and no power-of-two rounding (a slot is exactly its pages);
//  - mapped mode: host-located VMM handles (CUDA HOST_NUMA; memfds on the host backend) of
//    the slot's size, each also mapped at its own address in a window so copies can reach it
//    while it is not mapped at the evicted handle's address. A released slot is kept for the
//    next of its size; one of another size is given back when room is needed. The window, the
//    handles and their mappings are made and given back by the PageTable, which owns every
//    reservation, handle and mapping; the pool asks it, and calls the backend only for pinned
//    host memory (which is no mapping).
// Its size: host_capacity, or by default four times the device capacity, at most half the
// machine's memory (default_capacity).
// Invariant: used pages * page_bytes <= held bytes <= capacity; a slot never crosses a chunk;
// after release_all() nothing is held.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "vmm/page_table.hpp"
#include "vmm/range_set.hpp"

namespace vta {

class HostPool {
 public:
  struct Slot {
    uintptr_t addr = 0;    // where the bytes can be copied to/from
    PageHandle page = 0;   // mapped mode: the host-located handle (0 in copy mode)
    uint32_t npages = 0;   // how many pages it holds
  };

  HostPool(Backend& backend, PageTable& pages, uint64_t capacity_bytes, bool mapped);
  // The capacity when none is configured: four times the device capacity, at most half the
  // machine's memory.
  static uint64_t default_capacity(uint64_t device_capacity);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // The host memory of one away page: one slot, or in copy mode (when no run of its size is
  // free) several, each a whole number of pages, in address order of the away page.
  using Slots = std::vector<Slot>;

  // Slots for `npages` pages: one run if one can be had, else (copy mode) pieces; false when
  // the pool cannot hold them (nothing taken). Throws on driver errors.
  bool acquire(uint32_t npages, Slots* out);
  void release(const Slots& slots);
  // Where byte `offset` of an away page held in `slots` is.
  uintptr_t address_at(const Slots& slots, uint64_t offset) const;
  void release_all();

  bool mapped() const { return mapped_; }
  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t held_bytes() const { return held_; }  // pinned or created so far
  uint64_t used_bytes() const { return used_pages_ * page_; }

 private:
  bool acquire_run(uint32_t npages, Slot* out);
  bool acquire_pieces(uint32_t npages, Slots* out);
  void release_one(const Slot& slot);
  bool grow_pinned(uint64_t bytes);
  bool release_empty_chunks();
  bool create_mapped(uint32_t npages, Slot* out);
  void destroy_mapped(const Slot& s);

  Backend& backend_;  // pinned host memory only
  PageTable& pages_;  // the window, the host-located handles and their mappings
  size_t page_;
  uint64_t capacity_;
  bool mapped_;
  uint64_t held_ = 0;
  uint64_t used_pages_ = 0;
  // Copy mode.
  RangeSet free_pinned_;                          // free pieces of the chunks
  std::vector<std::pair<void*, size_t>> chunks_;  // pinned chunks
  // Mapped mode.
  std::vector<Slot> free_slots_;  // created, unused
  std::vector<Slot> created_;     // every host handle created
  RangeSet free_window_;          // unused addresses of the window
  uintptr_t window_ = 0;          // the window (the page table's)
  size_t window_bytes_ = 0;
};

}  // namespace vta
