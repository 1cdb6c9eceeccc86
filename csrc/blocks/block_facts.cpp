// BlockFacts: the reads the eviction engine makes of the blocks over a range (see block_facts.hpp).
//
// Owns: nothing beyond block_facts.hpp's.
// Invariants: those of block_facts.hpp; every read walks the live allocations over the range
// in address order (LiveAllocations::for_each_in), so streams are named in that order.
#include "blocks/block_facts.hpp"

#include <algorithm>

namespace vta {

void BlockFacts::add_live_streams(uintptr_t va, uint64_t bytes, std::vector<StreamHandle>* streams) const {
  live_.for_each_in(va, bytes, [&](uintptr_t address, const Allocation& a) {
    add_stream(streams, a.stream);
    uses_.add_recorded(address, streams);
  });
}

void BlockFacts::add_freed_streams(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const {
  pending_.add_streams_over(vas, streams);
  uses_.add_streams_over(vas, streams);  // and a block freed after record_stream
}

bool BlockFacts::evictable(uintptr_t va, uint64_t bytes, uintptr_t except) const {
  bool any = false, all = true;
  live_.for_each_in(va, bytes, [&](uintptr_t address, const Allocation& a) {
    any = true;
    if (address != except && (a.kept || !a.evictable)) all = false;
  });
  return any && all;
}

void BlockFacts::live_ranges(uintptr_t va, uint64_t bytes, std::vector<ByteRange>* out) const {
  out->clear();
  live_.for_each_in(va, bytes, [&](uintptr_t address, const Allocation& a) {
    uint64_t lo = std::max<uint64_t>(address, va);
    uint64_t hi = std::min<uint64_t>(address + (a.kept ? a.size : std::max<uint64_t>(a.requested, 1)), va + bytes);
    if (hi <= lo) return;
    if (!out->empty() && out->back().offset + out->back().bytes >= lo - va) {
      ByteRange& last = out->back();
      last.bytes = std::max(last.offset + last.bytes, hi - va) - last.offset;
    } else {
      out->push_back({lo - va, hi - lo});
    }
  });
}

bool BlockFacts::pausable(uintptr_t va, uint64_t bytes, uint32_t region) const {
  bool any = false, all = true;
  live_.for_each_in(va, bytes, [&](uintptr_t, const Allocation& a) {
    any = true;
    all = all && a.region == region;
  });
  return any && all;
}

}  // namespace vta
