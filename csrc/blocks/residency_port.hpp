// ResidencyPort: what the allocation policy asks of the eviction engine, and nothing more:
// queries (which pages are away; the host pool, for messages) and notices (pages used, an
// allocation gone, an away page no block touches any more).
//
// Owns: nothing; an interface that csrc/evict implements (the policy never includes evict/),
// declared below both so that neither includes the other. Calls go one way, from the policy to
// the engine: what the engine needs to know of the blocks over a page it reads as data from
// BlockFacts (block_facts.hpp), never by calling the policy back. Work that frees,
// evicts or maps a device page for the policy is not here: when the policy's own sources of
// handles are spent, the address space asks the engine (Residency::free_device_page) between
// two steps of the allocation (AllocPolicy::begin_allocate / resume) or of a restore.
// Invariants: every call is made under the address space's lock. A virtual page is "away"
// when live data on it is not, or not only, in a device page (evicting, evicted, restoring,
// restored): the policy never maps, unmaps or reuses such a page itself, it asks here. The
// mapping under live or pending-free data changes only after the engine has waited for every
// stream that may touch it (invariant 4, csrc/evict/residency.hpp).
#pragma once

#include <cstdint>

namespace vta {

class ResidencyPort {
 public:
  // Queries: whether any virtual page is away, and which.
  virtual bool any_away() const = 0;
  virtual bool is_away(uintptr_t va) const = 0;
  // The away page over `va` (one handle's pages, which move together): its first virtual page
  // and its bytes; false when `va` is not away.
  virtual bool away_span(uintptr_t va, uintptr_t* first, uint64_t* bytes) const = 0;
  // Notices: the engine brings what it owns up to date, and takes nothing from the policy.
  // No block touches the away page at `first` any more (its frees completed): the bytes are dead,
  // so the engine forgets its away copy (its host slot; in mapped mode the host copy mapped at the
  // address, or a restore's device page, put at the address now). A device page still mapped
  // there stays (the caller caches it); otherwise the address ends up unmapped. The one notice
  // that has the engine touch the device (AllocPolicy::release_block sends it): it waits only for
  // the page's own copy (an event of the engine's copy stream), never for a block's stream (no
  // block is left on the page), and reads nothing but its own state and BlockFacts.
  virtual void drop_away_page(uintptr_t first) = 0;
  // The pages of [start, start + bytes) were used, or may have become (un)evictable: the
  // engine's victim policy (evict/victim_policy.hpp) brings its candidates up to date.
  virtual void note_use(uintptr_t start, uint64_t bytes) = 0;
  // The live allocation over [start, start + bytes) no longer makes its pages victims (freed,
  // or kept by a graph pool): as note_use() over it, but the pages only it covers simply stop
  // being candidates, in one step whatever its size (only its first and last pages, which it
  // may share with neighbours, are looked at one by one).
  virtual void note_left(uintptr_t start, uint64_t bytes) = 0;
  // For out-of-memory messages.
  virtual uint64_t host_pool_used_bytes() const = 0;
  virtual uint64_t host_pool_capacity_bytes() const = 0;

 protected:
  ~ResidencyPort() = default;
};

}  // namespace vta
