// LiveAllocations implementation.
//
// Owns: the lookups and the not-live error messages.
// Invariants: those of live_allocations.hpp.
#include "blocks/live_allocations.hpp"

#include <algorithm>
#include <string>

#include "blocks/text.hpp"
#include "vmm/event_pool.hpp"

namespace vta {

void LiveAllocations::add(uintptr_t address, const Allocation& a) {
  map_[address] = a;
  if (a.region) tagged_++;
  allocated_bytes_ += a.requested;
  active_bytes_ += a.size;
  peak_allocated_bytes_ = std::max(peak_allocated_bytes_, allocated_bytes_);
  peak_active_bytes_ = std::max(peak_active_bytes_, active_bytes_);
  num_allocs_++;
  allocated_total_ += a.size;
  requested_total_ += a.requested;
}

Allocation LiveAllocations::erase(Map::iterator it) {
  const Allocation a = it->second;
  map_.erase(it);
  if (a.region) tagged_--;
  if (a.evictable) evictable_bytes_ -= a.size;
  allocated_bytes_ -= a.requested;
  active_bytes_ -= a.size;
  num_frees_++;
  freed_total_ += a.size;
  requested_freed_total_ += a.requested;
  return a;
}

void LiveAllocations::keep(Map::iterator it) {
  uintptr_t address = it->first;
  Allocation a = erase(it);  // the counters of a free
  a.kept = true;
  a.evictable = false;
  map_[address] = a;
  if (a.region) tagged_++;  // erase() counted it out
  kept_++;
  kept_bytes_ += a.size;
}

void LiveAllocations::unkeep(Map::iterator it, uint64_t requested) {
  Allocation a = it->second;
  uintptr_t address = it->first;
  map_.erase(it);
  if (a.region) tagged_--;  // add() counts it in again
  kept_--;
  kept_bytes_ -= a.size;
  a.kept = false;
  a.requested = requested;
  add(address, a);
}

Allocation LiveAllocations::erase_kept(Map::iterator it) {
  const Allocation a = it->second;
  map_.erase(it);
  if (a.region) tagged_--;
  kept_--;
  kept_bytes_ -= a.size;
  return a;
}

LiveAllocations::Map::iterator LiveAllocations::find_kept(uintptr_t address) {
  auto it = map_.find(address);
  if (it == map_.end() || !it->second.kept)
    fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " is not a block kept for its graph pool");
  return it;
}

void LiveAllocations::set_evictable(Map::iterator it, bool evictable) {
  Allocation& a = it->second;
  if (a.evictable == evictable) return;
  if (evictable)
    evictable_bytes_ += a.size;
  else
    evictable_bytes_ -= a.size;
  a.evictable = evictable;
}

[[noreturn]] void LiveAllocations::throw_not_live(uintptr_t address) const {
  auto it = map_.upper_bound(address);
  if (it != map_.begin()) {
    --it;
    if (address == it->first && it->second.kept)
      fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " was already freed (its block is kept by a graph pool)");
    if (address > it->first && address < it->first + it->second.size)
      fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " is inside the allocation at " + hex(it->first) +
                                         " (an interior pointer), not the start of an allocation");
  }
  for (auto& [base, bytes] : pages_.reservations())
    if (address >= base && address < base + bytes)
      fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " is not a live allocation (already freed?)");
  fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " does not belong to this address space");
}

LiveAllocations::Map::iterator LiveAllocations::find_live(uintptr_t address) {
  auto it = map_.find(address);
  if (it == map_.end() || it->second.kept) throw_not_live(address);
  return it;
}

const Allocation& LiveAllocations::find_range(uintptr_t address, uint64_t offset, uint64_t nbytes) {
  auto it = map_.upper_bound(address);
  if (it == map_.begin()) throw_not_live(address);
  --it;
  const Allocation& a = it->second;
  uint64_t into = address - it->first;
  if (address < it->first || into >= a.requested || a.kept) throw_not_live(address);
  uint64_t room = a.requested - into;
  if (offset > room || nbytes > room - offset)
    fail(VTA_ERR_INVALID_ARGUMENT, "access of " + std::to_string(nbytes) + " bytes at offset " + std::to_string(offset) +
                                       " runs past the end of the " + std::to_string(a.requested) +
                                       "-byte allocation at " + hex(it->first));
  return a;
}

bool LiveAllocations::any_on_stream(StreamHandle stream) const {  // kept ones too: the stream still matters
  for (const auto& [address, a] : map_)
    if (a.stream == stream) return true;
  return false;
}

void LiveAllocations::fill_stats(vta_stats_t* s) const {
  s->allocated_bytes = allocated_bytes_;
  s->active_bytes = active_bytes_;
  s->peak_allocated_bytes = peak_allocated_bytes_;
  s->peak_active_bytes = peak_active_bytes_;
  s->num_allocs = num_allocs_;
  s->num_frees = num_frees_;
  s->num_live_allocs = map_.size() - kept_;
  s->allocated_bytes_total = allocated_total_;
  s->freed_bytes_total = freed_total_;
  s->requested_bytes_total = requested_total_;
  s->requested_freed_bytes_total = requested_freed_total_;
  s->evictable_bytes = evictable_bytes_;
}

void LiveAllocations::reset_peak() {
  peak_allocated_bytes_ = allocated_bytes_;
  peak_active_bytes_ = active_bytes_;
}

}  // namespace vta
