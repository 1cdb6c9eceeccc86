// CopyRuns: the copies that move a batch of away pages (a region paused or resumed), as few as
// the addresses allow (docs/design.md, glossary: copy run).
//
// Owns: the grouping of a batch's handles into copy runs, the longest stretches over which both
// the virtual pages and the host memory they move to or from are contiguous, one copy each; and
// the split of one host slot run among the handles of a stretch of adjacent virtual pages (copy
// mode), so that one-page handles side by side cost one copy per stretch, not one per page.
// Invariants: every byte added is in exactly one run, in the order added; a run never crosses a
// gap in the virtual pages or in the host memory; no driver call here (StreamOrder issues the
// copies).
#pragma once

#include <cstdint>
#include <vector>

#include "evict/host_pool.hpp"

namespace vta {

class CopyRuns {
 public:
  struct Run {
    uintptr_t va;
    uintptr_t host;
    uint64_t bytes;
  };

  explicit CopyRuns(size_t page_bytes) : page_bytes_(page_bytes) {}

  // The bytes of one handle, from its first virtual page `va`, and the slots that hold (or will
  // hold) them, in address order: each slot extends the last run when it continues it on both sides.
  void add(uintptr_t va, const HostPool::Slots& slots);
  const std::vector<Run>& runs() const { return runs_; }

  // `slots` (a run of host memory for a stretch of handles, in address order) cut into one Slots
  // per handle, of npages[i] pages each; their pages together must be the slots' pages.
  static std::vector<HostPool::Slots> split(const HostPool::Slots& slots, const std::vector<uint32_t>& npages,
                                            size_t page_bytes);

 private:
  size_t page_bytes_;
  std::vector<Run> runs_;
};

}  // namespace vta
