// ResidencyPort: what the allocation policy asks of the eviction engine, and nothing more.
//
// Owns: nothing; an interface that csrc/evict implements (the policy never includes evict/).
// Calls go one way, from the policy to the engine; what the engine needs to know of the blocks
// over a page it asks through PageUsers (page_users.hpp), which only answers.
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
  // Memory is short and the cheaper sources are spent: make a device page free, in this
  // order: release the device pages that evicted pages still hold (one wait for their
  // streams), else finish the eviction copies still running (their pages are held next),
  // else, if `may_evict`, evict the evictable handle its victim policy picks (least recently
  // used first), else give back the
  // device page of a restore made ahead of need (a prefetch). Never a page of the pinned range
  // (pin()). False when none of these could be done (nothing changed); true means "try to
  // acquire a page again".
  virtual bool free_device_page(bool may_evict) = 0;
  // While [lo, hi) is pinned, free_device_page() takes nothing from its pages: the block being
  // placed there, or the allocation being made resident. unpin() ends it.
  virtual void pin(uintptr_t lo, uintptr_t hi) = 0;
  virtual void unpin() = 0;
  virtual bool any_away() const = 0;
  virtual bool is_away(uintptr_t va) const = 0;
  // The away page over `va` (one handle's pages, which move together): its first virtual page
  // and its bytes; false when `va` is not away.
  virtual bool away_span(uintptr_t va, uintptr_t* first, uint64_t* bytes) const = 0;
  // No block touches the away page at `first` any more (its frees completed): forget its away
  // copy. A device page still mapped there stays (the caller caches it); otherwise the address
  // ends up unmapped.
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
