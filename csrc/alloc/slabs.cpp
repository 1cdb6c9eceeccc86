// Slabs implementation.
//
// Owns: the block, used-bytes, spare and stash bookkeeping of slabs.
// Invariants: those of slabs.hpp.
#include "alloc/slabs.hpp"

#include "backend/status.hpp"

namespace vta {

uintptr_t Slabs::take_block_in_new_slab(uintptr_t slab, uint64_t bytes) {
  used_[slab] = 0;
  free_blocks_.insert(slab, page_bytes_);
  uintptr_t block = 0;
  bool taken = free_blocks_.take_best_fit(bytes, &block);
  VTA_INVARIANT(taken);
  return block;
}

void Slabs::count_taken(uintptr_t block, uint64_t bytes) {
  uintptr_t slab = block - block % page_bytes_;
  used_[slab] += bytes;
  if (slab == spare_) spare_ = 0;
}

uint64_t Slabs::count_released(uintptr_t slab, uint64_t bytes) {
  uint64_t& used = used_[slab];
  used -= bytes;
  return used;
}

bool Slabs::keep_as_spare(uintptr_t slab) {
  if (spare_ != 0) return false;
  spare_ = slab;  // keep one empty slab: alloc/free of one small block stays cheap
  return true;
}

void Slabs::remove_empty(uintptr_t slab) {
  bool taken = free_blocks_.take_exact(slab, page_bytes_);
  VTA_INVARIANT(taken);
  used_.erase(slab);
}

bool Slabs::take_spare(uintptr_t* slab) {
  if (!spare_) return false;
  remove_empty(spare_);
  *slab = spare_;
  spare_ = 0;
  return true;
}

void Slabs::forget(uintptr_t slab) {
  stash_.erase(slab);
  used_.erase(slab);
  take_slab_blocks(slab);  // the free blocks hold its blocks if a restore completed meanwhile
}

bool Slabs::has_live_blocks(uintptr_t va) const {
  auto it = used_.find(va);
  return it != used_.end() && it->second > 0;
}

std::vector<std::pair<uintptr_t, uint64_t>> Slabs::take_slab_blocks(uintptr_t slab) {
  std::vector<std::pair<uintptr_t, uint64_t>> blocks;
  auto& ranges = free_blocks_.ranges();
  for (auto it = ranges.lower_bound(slab); it != ranges.end() && it->first < slab + page_bytes_; ++it)
    blocks.push_back(*it);
  for (auto& [a, n] : blocks) free_blocks_.take_exact(a, n);
  return blocks;
}

void Slabs::stash(uintptr_t slab) {
  auto blocks = take_slab_blocks(slab);
  auto& stash = stash_[slab];
  stash.insert(stash.end(), blocks.begin(), blocks.end());
}

void Slabs::unstash(uintptr_t slab) {
  auto it = stash_.find(slab);
  if (it == stash_.end()) return;
  for (auto& [a, n] : it->second) free_blocks_.insert(a, n);
  stash_.erase(it);
}

void Slabs::clear() {
  free_blocks_.clear();
  used_.clear();
  stash_.clear();
  spare_ = 0;
}

}  // namespace vta
