// AddressSpace: one paged virtual address space, the facade over the allocation policy and
// the eviction engine.
//
// Owns, as members (composition: it inherits from nothing): the backend (under a
// CallCountingBackend, and under its extension's adaptor when the process installed an
// extension: space/space_extension.hpp), the PageTable and the EventPool of one space; the
// allocation policy (csrc/alloc: the block records of csrc/blocks, the free virtual space and the
// cached handles) and the eviction engine (csrc/evict: away pages, victim policy, host pool,
// copy stream), which it hands the policy's BlockFacts to read (the engine never calls the
// policy); the regions' totals; its extension, if any; and the one mutex that guards all of
// it. Every public method takes the mutex, so no part below is ever entered by two threads; no
// call ever enters Python. The policy's order is in alloc/alloc_policy.hpp, the residency states
// and the ordering rule (invariant 4) in evict/residency.hpp. It has no test hook: what tests
// reach (fault injection, broken ordering rules, test streams and kernels) is its extension's
// (space/testing/), composed through with_parts.
//
// Invariants: every address is 512-byte aligned (pages are shared between allocations);
// addresses never change (eviction included); a device page is unmapped only
// once the events after its last use completed; mapped pages never exceed capacity; a
// failure at any step leaves the page where its bytes were and reports a typed error; after
// close() every call but close() fails with VTA_ERR_CLOSED and nothing is held.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "alloc/alloc_policy.hpp"
#include "backend/backend.hpp"
#include "backend/backend_registry.hpp"
#include "backend/call_counting.hpp"
#include "evict/residency.hpp"
#include "space/regions.hpp"
#include "space/space_extension.hpp"
#include "vmm/event_pool.hpp"
#include "vmm/page_table.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

class AddressSpace {
 public:
  // Validates the config, creates the backend; throws Error on failure.
  static std::unique_ptr<AddressSpace> create(const vta_config_t& config);
  ~AddressSpace();

  // allow_evict: under pressure, evict least-recently-used evictable pages before failing.
  // A stream the backend does not know is refused (Backend::check_stream: host only).
  // count_oom false: a try (VTA_MALLOC_TRY): running short of pages throws OutOfMemory without
  // counting an OOM, the shortage a leased space's page source answers (a request over capacity
  // is an OOM all the same).
  // region: the region tag the allocation carries (alloc/region_tags.hpp; 0: none).
  uintptr_t malloc(uint64_t nbytes, StreamHandle stream, bool allow_evict = true, bool count_oom = true,
                   uint32_t region = 0);
  // free, size_of and the eviction calls take the start address malloc returned; read and
  // write take any address inside a live allocation, and [address + offset, + nbytes) must
  // lie inside its requested bytes (an interior address is an error everywhere else).
  void free(uintptr_t address);
  uint64_t size_of(uintptr_t address);
  void write(uintptr_t address, uint64_t offset, const void* src, uint64_t nbytes);
  void read(uintptr_t address, uint64_t offset, void* dst, uint64_t nbytes);
  uint64_t trim();
  // The device pages that offloaded allocations still hold, released (their bytes are safe on
  // the host): one wait for the streams that may touch them, no wait for copies in flight.
  // wait: first wait for the copies in flight, so their pages are released too.
  uint64_t release_offloaded(bool wait);
  void synchronize();
  void close();

  // Eviction (csrc/space/address_space_residency.cpp; the engine is csrc/evict/).
  void set_evictable(uintptr_t address, bool evictable);
  // The bytes of the allocation now away (pages shared with allocations not marked evictable stay).
  uint64_t offload(uintptr_t address);
  // count_oom false: a try (VTA_RESTORE_TRY), as for malloc.
  void prefetch(uintptr_t address, const StreamHandle* stream, bool count_oom = true);
  void ensure_resident(uintptr_t address, const StreamHandle* stream, bool count_oom = true);
  int residency(uintptr_t address);
  // Regions (csrc/space/address_space_regions.cpp; docs/regions.md): the allocations carrying
  // one tag paused (off the device, addresses kept; discard: no copy) and resumed (all or
  // nothing; count_oom false: a try, as for malloc). The device page bytes moved.
  uint64_t pause_region(uint32_t region, bool discard);
  uint64_t resume_region(uint32_t region, bool count_oom = true);
  std::vector<vta_region_info_t> region_infos();

  // Leased mode (VTA_CONFIG_LEASED): pages come from the service, not from the backend.
  // A tag names one page held: a second import with the same tag is refused.
  void import_page(int fd, uint64_t tag);
  std::vector<uint64_t> return_pages(uint64_t max_pages);

  // For PyTorch's full allocator interface (csrc/space/address_space_torch.cpp).
  // record_stream: the live allocation at `address` is also used on `stream` (alloc_policy.hpp).
  void record_stream(uintptr_t address, StreamHandle stream);
  // Graph pools (AllocPolicy::keep / unkeep / release_kept).
  void keep(uintptr_t address);
  bool unkeep(uintptr_t address, uint64_t requested);
  void release_kept(uintptr_t address);
  // The bytes a request of nbytes takes (rounded); InvalidArgument for 0 or too large.
  uint64_t rounded_size(uint64_t nbytes);
  // Whether `address` lies in one of this space's reservations (no lock: the reservations
  // of a space only grow while it is open; a closed space answers false).
  bool holds_address(uintptr_t address);
  // The live allocation containing `address` (any address inside it): its start and record.
  bool containing(uintptr_t address, uintptr_t* base, Allocation* out);
  // The cap on pages held (0: capacity) and the cap in force; the largest allocation that
  // fits under it now without evicting: the cap less the pages blocks use (live, kept, pending).
  void set_limit(uint64_t bytes);
  uint64_t limit();
  uint64_t largest_allocatable();
  // Every record, kept ones included, in address order.
  std::vector<std::pair<uintptr_t, Allocation>> records();

  // Introspection (csrc/space/address_space_stats.cpp).
  vta_stats_t stats();
  void reset_peak_stats();
  std::vector<vta_page_info_t> pages();
  std::vector<vta_alloc_info_t> allocations();
  int backend_kind() const { return backend_kind_; }
  // The backend's registry entry (never null: the registry made it) and what it can do.
  const BackendInfo& backend_info() const { return *backend_info_; }
  const BackendCapabilities& capabilities() const { return capabilities_; }
  int device() const { return device_; }
  // The cost model's host clock (modeled_host_ns, backend.hpp); false (and 0) without a cost
  // model (csrc/space/address_space_stats.cpp).
  bool modeled_ns(uint64_t* out);

  // Composition from outside (space/space_extension.hpp): the extension the installed factory
  // made for this space (null: none), and `fn(SpaceParts&)` run on this space's parts under its
  // lock, the space open (VTA_ERR_CLOSED otherwise); fn must not keep the parts.
  SpaceExtension* extension() const { return extension_.get(); }
  template <typename Fn>
  decltype(auto) with_parts(Fn&& fn) {
    std::lock_guard<std::mutex> lk(mu_);
    check_open_locked();
    SpaceParts parts{*backend_, policy_, residency_};
    return fn(parts);
  }

 private:
  AddressSpace(std::unique_ptr<Backend> backend, std::unique_ptr<SpaceExtension> extension, const vta_config_t& config,
               uint64_t capacity, size_t page_bytes);

  void check_open_locked() const;
  // The driver call counters of the stats (every call of this space passes calls_).
  void fill_call_counts(vta_stats_t* s) const;
  // Check open, complete the copies that finished, and find the live allocation at `address`.
  LiveAllocations::Map::iterator settled_live_locked(uintptr_t address);
  // Restore the away pages of [start, start + bytes) for `consumer`: device handles come from the
  // policy, the copies from the engine (prefetch); ensure_resident_locked() also waits for them.
  void restore_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer, bool count_oom = true);
  void ensure_resident_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer, bool count_oom = true);
  // Refuse (VTA_ERR_PAUSED) an entry point that would touch the allocation [start, + bytes) while
  // a page of it is paused; `what` names the entry point.
  void check_not_paused_locked(uintptr_t start, uint64_t bytes, const char* what) const;
  // Check open, complete the copies that finished, and list the allocations carrying `region`;
  // refused while a stream of theirs captures a CUDA graph (`what`: the entry point).
  std::vector<std::pair<uintptr_t, uint64_t>> settled_region_locked(uint32_t region, const char* what);

  mutable std::mutex mu_;
  bool closed_ = false;
  bool leased_ = false;
  std::unique_ptr<SpaceExtension> extension_;  // null without an installed factory; declared before backend_
  CallCountingBackend* calls_;  // directly over the backend, under the extension's adaptor; owned by backend_
  std::unique_ptr<Backend> backend_;  // the chain: the extension's adaptor (if any) over calls_
  int backend_kind_;
  const BackendInfo* backend_info_;
  BackendCapabilities capabilities_;
  int device_;
  uint64_t capacity_;
  size_t page_bytes_;
  PageTable pages_;
  EventPool events_;
  AllocPolicy policy_;    // needs pages_, events_
  Residency residency_;   // reads policy_.facts(); the policy's ResidencyPort
  Regions regions_;       // the regions' totals (the tags are on the allocations, the paused pages the engine's)
};

}  // namespace vta
