// VictimPolicy: which resident page the eviction engine evicts when memory is short.
//
// Owns: nothing; the interface between the engine (Residency), which decides which pages may
// be victims at all (resident, mapped, every allocation on them marked evictable) and does the
// eviction, and a policy, which only keeps the candidates in the order it would give them up.
// The first and only implementation in the core is LruPolicy (lru_policy.hpp): least recently
// used first.
//
// This is vtalloc's one victim policy (docs/design.md, "Glossary"). Four other choices of what
// gives up memory work at a coarser grain above it, each with its own word and inputs:
//  - the give-back order (client/pressure.py, evict_for_pressure): when the daemon asks a
//    client for pages, free and cached pages first, then allocations offloaded;
//  - the pressure targets (server/ledger_victims.py, LedgerVictims.pick): which sessions the
//    daemon asks for pages, principals above their minimum, most excess first;
//  - evict-behind (allocator/torch/activation_paging.py): in a training step, the oldest saved
//    tensors over a byte budget, on the order recorded in iteration 0;
//  - make room (allocator/torch/activation_room.py): when the space refuses the pager a page,
//    saved tensors backward has finished with, then those needed last.
//
// Invariants: each page is a candidate at most once; forget() and forget_range() of pages that
// are not ones do nothing; forget_range() costs no step per page it spans (a freed or evicted
// allocation of any size: O(log n + ranges it overlaps) in the LRU); visit() offers the candidates best victim first and stops at the first one the
// visitor takes (returns true), before it looks at the next, so the visitor may change the
// candidates (evicting a page forgets it) as long as it then returns true. Every call is made
// under the address space's lock.
#pragma once

#include <cstdint>
#include <functional>

namespace vta {

class VictimPolicy {
 public:
  virtual ~VictimPolicy() = default;
  // Page `va` was used now and may be evicted: a candidate (again), in this policy's order.
  virtual void note_use(uintptr_t va) = 0;
  // Page `va` may not be evicted any more (away, unmapped, or an allocation on it is not evictable).
  virtual void forget(uintptr_t va) = 0;
  // No page of [lo, hi) (page-aligned) may be evicted any more: forget() of each, in one step.
  virtual void forget_range(uintptr_t lo, uintptr_t hi) = 0;
  virtual void clear() = 0;
  // Offer the candidates to `take`, best victim first, until it returns true; whether it did.
  virtual bool visit(const std::function<bool(uintptr_t)>& take) const = 0;
  // Tests (vta_debug_victim_counters): the candidates now, and the entries the calls so far
  // touched (a page noted or forgotten, a stored range that forget_range() cut).
  virtual uint64_t candidate_pages() const = 0;
  virtual uint64_t entries_touched() const = 0;
};

}  // namespace vta
