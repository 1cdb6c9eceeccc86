// EvictionCounters: the eviction engine's running totals, the counting fields of the stats.
//
// Owns: evictions (and, of them, pressure evictions), restores, the bytes each copied, the
// issue-to-completion time of the copies and the time callers waited for restores, since the
// space was made. What is away now (pages evicted, held, in flight) is not counted here: it is
// read from the away pages when the stats are asked for.
// Invariants: the totals only grow; pages are counted, not handles (an extent of n pages
// counts n); a held device page taken back counts as a restore with no bytes copied.
#pragma once

#include <chrono>
#include <cstdint>

#include "vtalloc/vtalloc.h"

namespace vta {

class EvictionCounters {
 public:
  using Clock = std::chrono::steady_clock;

  // An eviction copy issued at `issued` completed.
  void evicted(uint32_t npages, uint64_t bytes, Clock::time_point issued) {
    evictions_ += npages;
    bytes_evicted_ += bytes;
    evict_copy_ns_ += ns_since(issued);
  }
  // Of those, evicted by memory pressure (the victim policy's choice).
  void pressure_evicted(uint32_t npages) { pressure_evictions_ += npages; }
  // A restore copy issued at `issued` completed.
  void restored(uint32_t npages, uint64_t bytes, Clock::time_point issued) {
    restores_ += npages;
    bytes_restored_ += bytes;
    restore_copy_ns_ += ns_since(issued);
  }
  // An evicted page whose device page was still held is resident again, with no copy.
  void taken_back(uint32_t npages) { restores_ += npages; }
  // A caller waited for restores since `since`.
  void waited(Clock::time_point since) { restore_wait_ns_ += ns_since(since); }

  void fill(vta_stats_t* s) const {
    s->evictions = evictions_;
    s->pressure_evictions = pressure_evictions_;
    s->bytes_evicted_total = bytes_evicted_;
    s->evict_copy_ns = evict_copy_ns_;
    s->restores = restores_;
    s->bytes_restored_total = bytes_restored_;
    s->restore_copy_ns = restore_copy_ns_;
    s->restore_wait_ns = restore_wait_ns_;
  }

 private:
  static uint64_t ns_since(Clock::time_point t) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
  }

  uint64_t evictions_ = 0, pressure_evictions_ = 0, bytes_evicted_ = 0, evict_copy_ns_ = 0;
  uint64_t restores_ = 0, bytes_restored_ = 0, restore_copy_ns_ = 0, restore_wait_ns_ = 0;
};

}  // namespace vta
