// Slabs: small allocations (<= small_threshold) as 512-byte blocks packed into one-page slabs.
//
// Owns: the free blocks of resident slabs, the live bytes of every slab, the one spare empty
// slab kept for reuse, and the stash of an evicted slab's free blocks.
// Invariants: a free block never crosses a slab (the block set fences at page boundaries);
// a slab is listed in used() from the moment it is carved until its last block is released
// and it leaves (as a cached or unmapped range, or the spare); an evicted slab's free blocks
// wait in the stash, not among the free blocks, so no new small allocation lands on a page
// that is away, and return when the page is resident again; at most one spare slab.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vmm/range_set.hpp"

namespace vta {

class Slabs {
 public:
  explicit Slabs(size_t page_bytes) : page_bytes_(page_bytes), free_blocks_(page_bytes) {}

  // A free block of `bytes` (a multiple of 512) in a resident slab; false when none fits.
  bool take_block(uint64_t bytes, uintptr_t* out) { return free_blocks_.take_best_fit(bytes, out); }
  // Carve the mapped page at `slab` into blocks and take one of `bytes` from it.
  uintptr_t take_block_in_new_slab(uintptr_t slab, uint64_t bytes);
  // Count a taken block as used (its slab is no longer the spare).
  void count_taken(uintptr_t block, uint64_t bytes);
  // Count a released block; returns the live bytes left in its slab.
  uint64_t count_released(uintptr_t slab, uint64_t bytes);
  // A released block of a resident slab becomes free; of an evicted slab, it is stashed.
  void add_free_block(uintptr_t block, uint64_t bytes) { free_blocks_.insert(block, bytes); }
  void stash_block(uintptr_t slab, uintptr_t block, uint64_t bytes) { stash_[slab].push_back({block, bytes}); }
  // An empty slab becomes the spare if there is none; false if there is one already.
  bool keep_as_spare(uintptr_t slab);
  // Take an empty resident slab out: its page is the caller's again.
  void remove_empty(uintptr_t slab);
  // Take the spare slab out, if any.
  bool take_spare(uintptr_t* slab);
  bool has_spare() const { return spare_ != 0; }
  // The slab held no live data any more while away: forget it (stash and free blocks too).
  void forget(uintptr_t slab);

  bool is_slab(uintptr_t va) const { return used_.count(va) != 0; }
  bool has_live_blocks(uintptr_t va) const;
  // The page is going away: move its free blocks to the stash (no new block may land on it).
  void stash(uintptr_t slab);
  // The page is resident again: its stashed blocks are free blocks again.
  void unstash(uintptr_t slab);
  void clear();

 private:
  // Remove and return a slab's free blocks.
  std::vector<std::pair<uintptr_t, uint64_t>> take_slab_blocks(uintptr_t slab);

  size_t page_bytes_;
  RangeSet free_blocks_;  // free 512-byte blocks inside resident slabs (never crosses a slab)
  std::unordered_map<uintptr_t, uint64_t> used_;  // slab base -> live bytes in it
  std::unordered_map<uintptr_t, std::vector<std::pair<uintptr_t, uint64_t>>> stash_;  // evicted slabs' free blocks
  uintptr_t spare_ = 0;  // one empty slab kept for reuse (0 = none)
};

}  // namespace vta
