// AllocPolicy: where an allocation goes, and where its memory goes when it is freed.
//
// Owns: the live allocations, the pending frees (stream-ordered reuse), the slabs and the free virtual ranges of one
// address space, the order in which a device page is obtained, and the counters of OOMs and
// page reclaims. It knows nothing of eviction beyond the ResidencyPort it is given.
//
// Allocation, in order, for n pages (large, > small_threshold):
//   1. best-fit among cached free ranges that still have pages mapped (no driver call);
//   2. grow a cached range in place: the largest cached range that free address space of its
//      reservation follows, the rest mapped there (its pages are not unmapped and mapped again);
//   3. best-fit among unmapped free ranges (reserving more VA if none fits), backed by
//      free (unmapped) pages of the page table, pages created under capacity, reclaimed from cached
//      free ranges, freed by waiting for frees still pending on their streams, or freed by
//      the eviction engine: releasing the device pages evicted pages still hold, finishing
//      eviction copies still running, evicting the least-recently-used evictable page,
//      giving back a prefetched restore's device page (obtain_handle, in that order);
//   4. if pending frees completed meanwhile, retry once (a small request may now fit a
//      freed block); then OutOfMemory.
// Before all of these, stream-ordered reuse: a block freed on the request's own stream and
// still pending is taken at once, best fit, with no event and no driver call (0.); only when
// none fits are the open frees of every stream sealed (one event each) and polled.
// A block on which record_stream named other streams skips all of this at its free: it waits
// in StreamUses for an event on each of them, then becomes a pending free of its own stream;
// an allocation that would otherwise fail waits for those events (steps 3 and 4) first.
// A kept block (keep(): a graph pool's freed block) stays out of every free set until
// release_kept(); unkeep() hands it back to its owner once its recorded streams are done.
// Small allocations (<= small_threshold) are 512-byte blocks packed into one-page slabs.
// Large allocations of at least min(kExtentMinBytes, extent_bytes) (and two pages) get extents when steps 2-3 map
// them: physical handles of several pages each, in size classes extent_bytes, half of it, ...
// down to two pages, largest first, then one page for the rest (docs/eviction.md, "Extents");
// smaller ones get one-page handles. An extent wanted is found, in order: free of its size,
// created under capacity, a cached one of its size unmapped, room made by releasing free
// handles of other sizes, then as for pages. A cached range or a pending
// free is only ever cut at a handle boundary, so an extent always lies under one allocation
// or one free range. When memory is short, free handles of the other kind are released to
// make room under capacity (an extent's bytes can back pages again, and the reverse); if the
// driver refuses an extent's size, the allocation falls back to one-page handles.
//
// Invariants: every address is 512-byte aligned; allocations of a page or more are
// page-aligned; a freed allocation's memory is reused on its own stream at once, and by
// anything else (another stream, a remap, the eviction engine) only after an event recorded
// on its stream after the free completed; a virtual page that is away is never reused, mapped or unmapped here (it is
// dropped through the port first); mapped pages never exceed capacity (the page table's
// limit); a failure at any step leaves every page where it was and reports a typed error.
#pragma once

#include <cstdint>
#include <vector>

#include "alloc/live_allocations.hpp"
#include "alloc/pending_frees.hpp"
#include "alloc/residency_port.hpp"
#include "alloc/slabs.hpp"
#include "alloc/stream_uses.hpp"
#include "alloc/virtual_ranges.hpp"
#include "vmm/event_pool.hpp"
#include "vmm/page_geometry.hpp"
#include "vmm/page_table.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

constexpr uint64_t kMinAlignment = 512;
// Larger requests are refused as invalid: no device has this much memory to back them.
constexpr uint64_t kMaxAllocationBytes = kMaxSpaceBytes;
// Allocations from this size up are backed by extents (when extents are on).
constexpr uint64_t kExtentMinBytes = 32ull << 20;
constexpr uint64_t kDefaultExtentBytes = 256ull << 20;

class AllocPolicy {
 public:
  struct Request {
    uint64_t requested;
    uint64_t rounded;  // 512-byte blocks, or whole pages
    bool small;
  };

  // Validates small_threshold; throws InvalidArgument. backend_kind: for the capture check
  // before an event is recorded on a stream (pending_frees.hpp).
  AllocPolicy(const vta_config_t& config, PageTable& pages, EventPool& events, uint64_t capacity, int backend_kind);
  AllocPolicy(const AllocPolicy&) = delete;
  AllocPolicy& operator=(const AllocPolicy&) = delete;
  void set_port(ResidencyPort* port) { port_ = port; }
  // The most pages the space may hold (set_per_process_memory_fraction): limit_bytes in
  // whole pages, at least one and at most capacity; 0: capacity.
  void set_limit(uint64_t limit_bytes);
  uint64_t limit() const { return limit_bytes_ ? limit_bytes_ : capacity_; }
  void set_skip_free_wait(bool skip) { skip_free_wait_ = skip; }  // VTA_DEBUG_BREAK_FREE_WAIT

  // Validate and round a request; throws InvalidArgument, or OutOfMemory over capacity.
  Request request(uint64_t nbytes);
  // Place a validated request (the policy above); `may_evict`: under pressure, evict
  // least-recently-used evictable pages before failing. Throws OutOfMemory.
  uintptr_t allocate(const Request& r, StreamHandle stream, bool may_evict);
  // The allocation becomes a pending free of its stream (no driver call; its stream may reuse
  // it at once, others after its event: pending_frees.hpp).
  void free(uintptr_t address);
  // record_stream: the live block at `address` is also used on `stream` (stream_uses.hpp).
  void record_stream(uintptr_t address, StreamHandle stream);
  // Add every stream that may touch the live allocations on virtual page `va`: each one's own
  // stream and the streams recorded on it. What an eviction copy and a mapping change wait for.
  void add_page_streams(uintptr_t va, std::vector<StreamHandle>* streams) const;
  // Graph pools: free the live block at `address` into a kept block; make a kept block live
  // again for `requested` bytes (false, nothing changed, while it waits for recorded
  // streams); free a kept block for good (its memory to the pending frees, as free() does).
  void keep(uintptr_t address);
  bool unkeep(uintptr_t address, uint64_t requested);
  void release_kept(uintptr_t address);
  // Release the pending frees whose events completed; if `wait`, seal every stream's open
  // frees first and wait for all of them. How many were released.
  uint64_t drain_pending(bool wait);
  // Seal every stream's open frees and release those already complete: what callers that
  // report or hand memory elsewhere do first (stats, pages, return_pages).
  void settle();
  // Seal one stream's open frees (before the stream is destroyed).
  void settle_stream(StreamHandle stream);
  // A device handle of `npages` pages (a page, or an extent when more than one) for the caller
  // to map, cheapest source first; false when none can be had. *driver_oom (if given) is set
  // when the driver refused an extent's size while capacity was there.
  bool obtain_handle(uint32_t npages, int32_t* id, bool may_evict, bool* driver_oom = nullptr);
  // No extents from now on (a leased space's pages are the service's one-page pages).
  void disable_extents() { extent_max_pages_ = 0; }
  // Unmap one cached page (or the spare slab's); false when there is none.
  bool reclaim_one_page();
  // Unmap one cached extent of exactly npages; false when there is none.
  bool reclaim_cached_extent(uint32_t npages);
  // Unmap every cached page, the spare slab's too (trim).
  void unmap_cached();
  [[noreturn]] void throw_oom(uint64_t requested, const char* why = nullptr);

  LiveAllocations& live() { return live_; }
  const LiveAllocations& live() const { return live_; }
  const PendingFrees& pending() const { return pending_; }
  const StreamUses& uses() const { return uses_; }
  Slabs& slabs() { return slabs_; }
  const Slabs& slabs() const { return slabs_; }
  size_t page_bytes() const { return page_bytes_; }
  uint64_t capacity() const { return capacity_; }
  // Bytes mapped under no live allocation: cached ranges and the spare slab.
  uint64_t cached_bytes() const { return ranges_.cached_bytes() + (slabs_.has_spare() ? page_bytes_ : 0); }
  void fill_stats(vta_stats_t* s) const;
  void reset_peak() { live_.reset_peak(); }
  // Forget everything (close(); the page table releases the pages).
  void clear();

 private:
  bool take_same_stream(const Request& r, StreamHandle stream, uintptr_t* out);
  // Hand the freed blocks whose recorded streams are done to the pending frees (all, waiting, if `wait`).
  uint64_t poll_uses(bool wait);
  // Where a freed block goes: the pending frees of its stream, or StreamUses first.
  void retire(uintptr_t address, const Allocation& a, bool kept);
  bool try_allocate(uint64_t rounded, bool small, bool may_evict, uintptr_t* out);
  bool map_range(size_t npages, bool may_evict, uintptr_t* out);
  // The handle sizes (in pages) that back a new range of npages.
  std::vector<uint32_t> handle_plan(size_t npages) const;
  void release_block(uintptr_t address, uint64_t size, bool small);
  void release_large_range(uintptr_t address, uint64_t size);
  void release_small_block(uintptr_t address, uint64_t size);
  uintptr_t page_of(uintptr_t a) const { return a - a % page_bytes_; }

  PageTable& pages_;
  ResidencyPort* port_ = nullptr;
  uint64_t capacity_;
  size_t page_bytes_;
  uint64_t small_threshold_;
  uint64_t extent_max_pages_;  // the largest extent; 0 when extents are off
  uint64_t extent_min_pages_;  // ranges of at least this many pages get extents
  LiveAllocations live_;
  PendingFrees pending_;
  StreamUses uses_;
  Slabs slabs_;
  VirtualRanges ranges_;
  bool skip_free_wait_ = false;
  uint64_t num_ooms_ = 0;
  uint64_t num_page_reclaims_ = 0;
  uint64_t num_alloc_retries_ = 0;
  uint64_t num_sync_all_streams_ = 0;
  bool retried_ = false;  // this allocation reclaimed cached pages or waited for frees
  uint64_t limit_bytes_ = 0;
};

}  // namespace vta
