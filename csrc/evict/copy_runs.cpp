// CopyRuns: a batch's copies as copy runs (see copy_runs.hpp).
//
// Owns: nothing beyond copy_runs.hpp's.
// Invariants: those of copy_runs.hpp.
#include "evict/copy_runs.hpp"

#include <algorithm>

#include "backend/status.hpp"

namespace vta {

void CopyRuns::add(uintptr_t va, const HostPool::Slots& slots) {
  for (const HostPool::Slot& s : slots) {
    uint64_t n = uint64_t{s.npages} * page_bytes_;
    if (!runs_.empty()) {
      Run& last = runs_.back();
      if (last.va + last.bytes == va && last.host + last.bytes == s.addr) {
        last.bytes += n;
        va += n;
        continue;
      }
    }
    runs_.push_back(Run{va, s.addr, n});
    va += n;
  }
}

std::vector<HostPool::Slots> CopyRuns::split(const HostPool::Slots& slots, const std::vector<uint32_t>& npages,
                                             size_t page_bytes) {
  std::vector<HostPool::Slots> out(npages.size());
  size_t k = 0;            // the slot being cut
  uint32_t used = 0;       // its pages handed out already
  for (size_t i = 0; i < npages.size(); ++i) {
    uint32_t want = npages[i];
    while (want > 0) {
      VTA_INVARIANT(k < slots.size());
      const HostPool::Slot& s = slots[k];
      uint32_t take = std::min(want, s.npages - used);
      out[i].push_back(HostPool::Slot{s.addr + uint64_t{used} * page_bytes, s.page, take});
      used += take;
      want -= take;
      if (used == s.npages) {
        ++k;
        used = 0;
      }
    }
  }
  VTA_INVARIANT(k == slots.size() && used == 0);
  return out;
}

}  // namespace vta
