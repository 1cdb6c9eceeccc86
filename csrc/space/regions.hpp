// Regions: what one address space's regions did, and what they hold now (docs/regions.md).
//
// Owns: the totals of each region tag in this space (pauses, resumes, the bytes each took off or
// brought back, their time), and the assembly of a region's row of vta_regions from the policy's
// allocations (which carry the tags) and the engine's away pages (which are paused or not).
// Invariants: the totals only grow; a row is listed for every tag that an allocation here carries
// or that was paused or resumed here; a paused page lies under blocks of one region only
// (BlockFacts::pausable), so its page and host bytes are counted for that region alone. Every
// call is made under the address space's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "blocks/live_allocations.hpp"
#include "evict/residency.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

class Regions {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Regions(size_t page_bytes) : page_bytes_(page_bytes) {}

  // A pause of `region` that began at `since` took `page_bytes` off the device; a resume brought them back.
  void paused(uint32_t region, uint64_t page_bytes, Clock::time_point since);
  void resumed(uint32_t region, uint64_t page_bytes, Clock::time_point since);
  // The allocations (kept ones too) that carry `region`, as (start, rounded bytes), address order.
  static std::vector<std::pair<uintptr_t, uint64_t>> spans(const LiveAllocations& live, uint32_t region);
  // One row per region of this space (see vtalloc.h, vta_region_info_t).
  std::vector<vta_region_info_t> infos(const LiveAllocations& live, const Residency& residency) const;
  void clear() { totals_.clear(); }

 private:
  struct Totals {
    uint64_t pauses = 0, resumes = 0, bytes_paused = 0, bytes_resumed = 0, pause_ns = 0, resume_ns = 0;
  };
  static uint64_t ns_since(Clock::time_point t);

  size_t page_bytes_;
  std::map<uint32_t, Totals> totals_;
};

}  // namespace vta
