// BlockFacts: what the blocks over a range of virtual pages are, as data the eviction engine reads.
//
// Owns: nothing; a read-only view over the three records of the blocks (LiveAllocations,
// PendingFrees, StreamUses), which the allocation policy owns and keeps current. The space
// builds it over the policy's records and hands it to the engine (csrc/evict), which reads
// here what it must know of the blocks over a page (their streams, which bytes hold data,
// whether they may be evicted or paused) instead of asking the policy: nothing here calls
// the policy, so the engine never calls back into it (calls go one way: docs/design.md,
// "Layers"; tests/test_one_way_loop.py).
// Invariants: every read is made under the address space's lock and changes nothing; no
// virtual function (what the engine reads is data, not a callback).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "blocks/live_allocations.hpp"
#include "blocks/pending_frees.hpp"
#include "blocks/stream_uses.hpp"

namespace vta {

// Bytes [offset, offset + bytes) of a handle, from its first virtual page.
struct ByteRange {
  uint64_t offset;
  uint64_t bytes;
};

class BlockFacts {
 public:
  BlockFacts(const LiveAllocations& live, const PendingFrees& pending, const StreamUses& uses)
      : live_(live), pending_(pending), uses_(uses) {}
  BlockFacts(const BlockFacts&) = delete;
  BlockFacts& operator=(const BlockFacts&) = delete;

  // Add every stream that may touch the live allocations over [va, va + bytes): each one's own
  // stream and the streams record_stream named on it (each stream once).
  void add_live_streams(uintptr_t va, uint64_t bytes, std::vector<StreamHandle>* streams) const;
  // Add the streams of freed blocks whose work may still run (pending frees, frees waiting for
  // recorded streams) over any of the virtual pages `vas`.
  void add_freed_streams(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const;
  // Some live allocation lies on [va, va + bytes), and every live allocation there other than
  // the one at `except` (0: none) may be evicted: marked evictable and not kept by a graph pool.
  bool evictable(uintptr_t va, uint64_t bytes, uintptr_t except = 0) const;
  // The bytes of [va, va + bytes) that hold data: each live allocation's requested bytes (a kept
  // block's whole size) clipped to the range, in address order, adjacent ones merged. What an
  // eviction copies: the rest of the handle holds nothing anyone may read.
  void live_ranges(uintptr_t va, uint64_t bytes, std::vector<ByteRange>* out) const;
  // Some live allocation lies on [va, va + bytes), and every one there (graph pools' kept blocks
  // included) carries region tag `region`: pausing the region may take these pages.
  bool pausable(uintptr_t va, uint64_t bytes, uint32_t region) const;

 private:
  const LiveAllocations& live_;
  const PendingFrees& pending_;
  const StreamUses& uses_;
};

}  // namespace vta
