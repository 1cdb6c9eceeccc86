// PageUsers: what the eviction engine may ask about the blocks over virtual pages, and nothing more.
//
// Owns: nothing; a read-only interface that AllocPolicy implements and the eviction engine
// (csrc/evict) is given, so that the engine never reaches into the policy's parts and never
// changes them: calls go from the policy (and the space) to the engine, answers come back
// through here.
// Invariants: every call is made under the address space's lock and changes nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"

namespace vta {

// Bytes [offset, offset + bytes) of a handle, from its first virtual page.
struct ByteRange {
  uint64_t offset;
  uint64_t bytes;
};

class PageUsers {
 public:
  // Add every stream that may touch the live allocations over [va, va + bytes): each one's own
  // stream and the streams record_stream named on it (each stream once).
  virtual void add_live_streams(uintptr_t va, uint64_t bytes, std::vector<StreamHandle>* streams) const = 0;
  // Add the streams of freed blocks whose work may still run (pending frees, frees waiting for
  // recorded streams) over any of the virtual pages `vas`.
  virtual void add_freed_streams(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const = 0;
  // Some live allocation lies on [va, va + bytes), and every live allocation there other than
  // the one at `except` (0: none) may be evicted: marked evictable and not kept by a graph pool.
  virtual bool evictable(uintptr_t va, uint64_t bytes, uintptr_t except = 0) const = 0;
  // The bytes of [va, va + bytes) that hold data: each live allocation's requested bytes (a kept
  // block's whole size) clipped to the range, in address order, adjacent ones merged. What an
  // eviction copies: the rest of the handle holds nothing anyone may read.
  virtual void live_ranges(uintptr_t va, uint64_t bytes, std::vector<ByteRange>* out) const = 0;
  // Some live allocation lies on [va, va + bytes), and every one there (graph pools' kept blocks
  // included) carries region tag `region`: pausing the region may take these pages.
  virtual bool pausable(uintptr_t va, uint64_t bytes, uint32_t region) const = 0;

 protected:
  ~PageUsers() = default;
};

}  // namespace vta
