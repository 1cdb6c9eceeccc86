// LiveAllocations: what malloc returned and free has not yet taken back.
//
// Owns: one Allocation record per live address, the bytes marked evictable, the records that
// carry a region tag, and the allocation counters of the stats (allocated/active bytes and their
// peaks, allocs, frees).
// Invariants: records never overlap; every record is 512-byte aligned and its size a whole
// number of 512-byte blocks (pages are shared between records); evictable_bytes() is the sum of
// the rounded sizes of the records marked evictable; an address that is not the start of a
// record is refused with a message that says what it is (interior pointer, freed, foreign).
// In blocks/: the allocation policy owns and changes these records; the eviction engine only
// reads them, through BlockFacts (block_facts.hpp), and never calls the policy.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <vector>

#include "backend/backend.hpp"
#include "vmm/page_table.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

struct Allocation {
  uint64_t size;       // rounded: whole 512-byte blocks
  uint64_t requested;
  StreamHandle stream;
  bool small;          // at or under small_threshold: PyTorch's small pool in the statistics
  bool evictable = false;
  bool kept = false;  // freed by its owner but kept out of reuse (a graph pool's: keep())
  uint32_t region = 0;  // the region tag it was allocated under (alloc/region_tags.hpp); 0: none
};

class LiveAllocations {
 public:
  using Map = std::map<uintptr_t, Allocation>;

  explicit LiveAllocations(const PageTable& pages) : pages_(pages), page_bytes_(pages.page_bytes()) {}

  void add(uintptr_t address, const Allocation& a);
  // The record that starts at `address`; throws InvalidArgument (throw_not_live) if none.
  Map::iterator find_live(uintptr_t address);
  // The record [address + offset, + nbytes) lies in (its requested bytes); throws if none.
  const Allocation& find_range(uintptr_t address, uint64_t offset, uint64_t nbytes);
  // Forget a record (free); returns it.
  Allocation erase(Map::iterator it);
  // A live record becomes kept (counted as freed); a kept one live again with `requested`
  // (counted as allocated); a kept one forgotten (no count: it was counted freed when kept).
  void keep(Map::iterator it);
  void unkeep(Map::iterator it, uint64_t requested);
  Allocation erase_kept(Map::iterator it);
  // The kept record at `address`; throws InvalidArgument if there is none.
  Map::iterator find_kept(uintptr_t address);
  void set_evictable(Map::iterator it, bool evictable);
  [[noreturn]] void throw_not_live(uintptr_t address) const;

  // Calls f(address, allocation) for each record (kept ones too) overlapping [va, va + bytes).
  template <typename F>
  void for_each_in(uintptr_t va, uint64_t bytes, F&& f) const;
  // The same over the virtual page at `va`.
  template <typename F>
  void for_each_on_page(uintptr_t va, F&& f) const {
    for_each_in(va, page_bytes_, f);
  }
  bool any_on_stream(StreamHandle stream) const;

  const Map& all() const { return map_; }  // kept records included
  uint64_t kept_bytes() const { return kept_bytes_; }
  uint64_t evictable_bytes() const { return evictable_bytes_; }
  // Records (kept ones too) that carry a region tag: while there are none, no placement looks at regions.
  uint64_t tagged() const { return tagged_; }
  uint64_t active_bytes() const { return active_bytes_; }
  void fill_stats(vta_stats_t* s) const;
  void reset_peak();
  void clear() {
    map_.clear();
    kept_ = kept_bytes_ = tagged_ = 0;
  }

 private:
  const PageTable& pages_;  // its reservations tell a freed address from a foreign one
  size_t page_bytes_;
  Map map_;
  uint64_t evictable_bytes_ = 0;
  uint64_t allocated_bytes_ = 0, active_bytes_ = 0;
  uint64_t peak_allocated_bytes_ = 0, peak_active_bytes_ = 0;
  uint64_t num_allocs_ = 0, num_frees_ = 0;
  uint64_t kept_ = 0, kept_bytes_ = 0;
  uint64_t tagged_ = 0;
  uint64_t allocated_total_ = 0, freed_total_ = 0, requested_total_ = 0, requested_freed_total_ = 0;
};

template <typename F>
void LiveAllocations::for_each_in(uintptr_t va, uint64_t bytes, F&& f) const {
  auto it = map_.lower_bound(va);
  if (it != map_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > va) f(prev->first, prev->second);
  }
  for (; it != map_.end() && it->first < va + bytes; ++it) f(it->first, it->second);
}

}  // namespace vta
