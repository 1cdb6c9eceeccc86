// AllocPolicy: where an allocation goes, and where its memory goes when it is freed.
//
// Owns: the live allocations, the pending frees (stream-ordered reuse), the free virtual space
// and the cached handles of one address space, the order in which a device handle is obtained,
// and the counters of OOMs and page reclaims. It knows nothing of eviction beyond the
// ResidencyPort it is given (queries and notices only: it never asks the engine to free, evict
// or map a page). It is never called by the engine: what the engine must know of the blocks it
// reads from the records the policy keeps (BlockFacts, blocks/block_facts.hpp), as data.
//
// Every allocation is one block: 512-byte aligned, its size rounded up to 512 bytes, anywhere
// in the free virtual space. Pages are mapped under blocks, and a page is held by every block
// that touches it, so blocks of every size share pages: a 3 MiB tensor takes 3 MiB of pages
// (plus the parts of at most two pages its neighbours may fill), not two whole pages.
//
// Allocation, in order, for a block of n bytes (begin_allocate, then resume after each page the
// engine freed; the space drives it, and the policy never calls the engine to free a page):
//   0. stream-ordered reuse: a block of the same size freed on the request's own stream and
//      still pending is taken at once, with no event and no driver call; then a free range over
//      mapped pages of at most twice the request (no event, no driver call); only when neither is
//      there are the open frees of every stream sealed (one event each) and polled;
//   1. best fit in the free virtual space, whatever is mapped under it: the smallest free range
//      that has room, at its lowest usable address (not over a page that is away, not on a
//      cached extent it would cover less than half of: see "Extents" below, and not on a handle
//      that a block of another region, or of no region, holds: see "Regions" below); the pages under it
//      that are not mapped yet are mapped, run by run, from free handles, handles created under
//      capacity, cached handles reclaimed (unmapped, oldest first), frees pending on their streams
//      waited for (take_handle, in that order). When those are spent the step ends with
//      needs_page: the space asks the eviction engine to free a device page (nothing under the
//      block: it is taken from the free space but not live yet) and resumes the placement where it
//      stood (resume(p, freed)), the runs mapped so far kept; nothing freed is as if the policy's
//      sources were spent for good;
//   2. if that found no page, the place that takes the fewest pages from capacity (unmapped
//      pages, and whole cached handles), sharing the pages at its ends with neighbours where it
//      can: never more than fresh virtual space (page-aligned, nothing mapped under it) would,
//      ceil(n / page), and every cached handle may go to it (take_fewest), mapped as in 1;
//   3. if pending frees completed meanwhile, retry once (the request may now fit a freed block);
//   4. if the request still finds no room, and the pages blocks touch leave room for it, split
//      the extents that blocks use only in part (alloc_policy_split.cpp): their touched pages get
//      handles of their own at the same addresses, their bytes are copied there, and the extent
//      is released, its untouched pages with it; then the fewest-pages place once more; then
//      failed (the space throws OutOfMemory).
// A Placement holds everything an allocation in progress holds (its range, the runs mapped, the
// handles taken for the current run), so abandon() gives it all back when an error ends it.
// So an allocation fails only when the pages blocks touch (live, kept and pending ones), plus the
// pages the request needs, exceed the capacity: no free memory is ever stuck between blocks, nor
// under an extent a block uses only in part.
// A block on which record_stream named other streams skips all of this at its free: it waits
// in StreamUses for an event on each of them, then becomes a pending free of its own stream;
// an allocation that would otherwise fail waits for those events (steps 2 and 3) first.
// A kept block (keep(): a graph pool's freed block) stays out of every free set until
// release_kept(); unkeep() hands it back to its owner once its recorded streams are done.
//
// Extents: a run of at least min(kExtentMinBytes, extent_bytes) (and two pages) of pages a new
// block covers whole is mapped with extents (physical handles of several pages each) of size
// classes extent_bytes, half of it, ... down to two pages, largest first, then one-page handles;
// a page a block covers only in part is always a one-page handle, so neighbours share one-page
// handles only. A later block may use part of a cached extent (free, mapped) only if it covers
// at least half of its pages: reuse of freed memory by a block of a similar size, with no driver
// call, while an extent a block keeps mapped never holds more than as many pages again unused.
// An extent wanted is found, in order: free of its size, created under capacity, a cached one of
// its size unmapped, room made by releasing free handles of other sizes, then as for pages; if
// the driver refuses an extent's size, the allocation falls back to one-page handles.
// An extent stays mapped while any block touches any of its pages (the driver maps a handle
// whole); only at the edge of an OOM is it split (step 4), never on the way to one.
//
// Regions: a block carries the region tag it was allocated under (region_tags.hpp). While any
// record carries one, a new block is not placed on a page or extent (at either of its ends) that
// a block of another region, or of none, holds: a region's pages are its own, so pausing it
// (docs/regions.md) moves all of them and no other block's bytes. A graph pool's kept block that
// is paused is not handed back to its pool (unkeep) until it is resumed.
//
// Invariants: every address is 512-byte aligned; a freed allocation's memory is reused on its
// own stream at once, and by anything else (another stream, a remap, the eviction engine) only
// after an event recorded on its stream after the free completed; a virtual page that is away is
// never given to a new block, mapped or unmapped here (it is dropped through the port once no
// block touches it); a handle is unmapped here only when it is cached (no block touches it);
// mapped pages never exceed capacity (the page table's limit), a split included; a failure at any
// step leaves every page where it was and reports a typed error.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "alloc/cached_handles.hpp"
#include "alloc/free_space.hpp"
#include "blocks/block_facts.hpp"
#include "blocks/live_allocations.hpp"
#include "blocks/pending_frees.hpp"
#include "blocks/residency_port.hpp"
#include "blocks/stream_uses.hpp"
#include "vmm/event_pool.hpp"
#include "vmm/page_geometry.hpp"
#include "vmm/page_table.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

constexpr uint64_t kMinAlignment = 512;
// Larger requests are refused as invalid: no device has this much memory to back them.
constexpr uint64_t kMaxAllocationBytes = kMaxSpaceBytes;
// Runs of pages from this size up are backed by extents (when extents are on).
constexpr uint64_t kExtentMinBytes = 32ull << 20;
constexpr uint64_t kDefaultExtentBytes = 256ull << 20;

class AllocPolicy final {
 public:
  struct Request {
    uint64_t requested;
    uint64_t rounded;  // whole 512-byte blocks
    bool small;        // at or under small_threshold: PyTorch's small pool in the statistics
    uint32_t region = 0;  // the region tag the block will carry (region_tags.hpp); 0: none
  };

  // Validates small_threshold; throws InvalidArgument. backend_kind: for the capture check
  // before an event is recorded on a stream (pending_frees.hpp).
  // `backend`: the space's backend, for the copies of an extent split (and its capture check).
  AllocPolicy(const vta_config_t& config, Backend& backend, PageTable& pages, EventPool& events, uint64_t capacity);
  AllocPolicy(const AllocPolicy&) = delete;
  AllocPolicy& operator=(const AllocPolicy&) = delete;
  void set_port(ResidencyPort* port) { port_ = port; }
  // The most pages the space may hold (set_per_process_memory_fraction): limit_bytes in
  // whole pages, at least one and at most capacity; 0: capacity.
  void set_limit(uint64_t limit_bytes);
  uint64_t limit() const { return limit_bytes_ ? limit_bytes_ : capacity_; }
  void set_skip_free_wait(bool skip) { skip_free_wait_ = skip; }  // VTA_DEBUG_BREAK_FREE_WAIT
  void set_skip_quiesce(bool skip) { skip_quiesce_ = skip; }      // VTA_DEBUG_BREAK_QUIESCE (splits)

  // Validate and round a request; throws InvalidArgument, or OutOfMemory over capacity.
  Request request(uint64_t nbytes);
  // An allocation in progress: everything a placement holds between two steps (a step ends
  // where the eviction engine must free a device page), so that the space can ask the engine
  // in between and abandon() can give it all back. The space reads what it needs to ask the
  // engine and to report; only the policy changes it.
  class Placement {
   public:
    // `may_evict`: under pressure, the engine may evict least-recently-used evictable pages;
    // `count_oom` false: a leased space's try, whose shortage its page source answers.
    Placement(const Request& r, StreamHandle stream, bool may_evict, bool count_oom)
        : request_(r), stream_(stream), may_evict_(may_evict), count_oom_(count_oom) {}
    Placement(const Placement&) = delete;
    Placement& operator=(const Placement&) = delete;
    bool may_evict() const { return may_evict_; }
    bool count_oom() const { return count_oom_; }
    uint64_t requested() const { return request_.requested; }
    // After needs_page: the pages of the handle wanted (a page, or an extent), and the block
    // [block_lo, block_hi) the engine must take nothing from.
    uint32_t pages_wanted() const { return wanted_; }
    uintptr_t block_lo() const { return at_; }
    uintptr_t block_hi() const { return at_ ? at_ + request_.rounded : 0; }
    // After done: the live allocation's address.
    uintptr_t address() const { return address_; }

   private:
    friend class AllocPolicy;
    // Which fit of which try (the order above): the best fit, then the fewest-pages place;
    // both again after waiting for pending frees; the fewest-pages place after extent splits.
    enum class Stage : uint8_t { start, best_fit, fewest, retry_best_fit, retry_fewest, split_fewest, failed };
    Request request_;
    StreamHandle stream_;
    bool may_evict_;
    bool count_oom_;
    Stage stage_ = Stage::start;
    uint64_t released_ = 0;  // pending frees released when they were settled (a retry if more are)
    uintptr_t at_ = 0;       // the range [at_, at_ + rounded) taken from the free space; 0: none
    std::vector<std::pair<uintptr_t, size_t>> runs_;  // its unmapped runs (first page, pages)
    size_t run_ = 0;                                  // the runs before it are mapped
    std::vector<uint32_t> plan_;                      // the current run's handle sizes
    bool one_page_ = false;                           // the plan is the one-page fallback (the driver refused an extent)
    std::vector<int32_t> ids_;                        // handles taken for the current run, not mapped yet
    uint32_t wanted_ = 0;
    uintptr_t address_ = 0;
  };
  // Where a placement stands after a step.
  enum class Step { done, needs_page, failed };
  // Place a validated request (the policy above) until it is live (done), its pages need a device
  // page that only the engine can free (needs_page: the space asks the engine, then resume()), or
  // it finds no room (failed: num_alloc_retries counted; the space throws OutOfMemory, through
  // throw_oom, counted in num_ooms unless count_oom is false). Throws only on driver errors, the
  // placement then holding what abandon() gives back.
  Step begin_allocate(Placement& p);
  // Go on after needs_page: `freed`, the engine freed a device page (the same handle is asked
  // for again); else the policy's sources are spent for this handle (one-page handles, then the
  // next place, as above).
  Step resume(Placement& p, bool freed);
  // Give back what the placement holds: the handles taken, the runs mapped, its range (an error
  // ended it). Nothing after done or failed. Called again, it does nothing more.
  void abandon(Placement& p);
  // The allocation becomes a pending free of its stream (no driver call; its stream may reuse
  // it at once, others after its event: pending_frees.hpp).
  void free(uintptr_t address);
  // record_stream: the live block at `address` is also used on `stream` (stream_uses.hpp).
  void record_stream(uintptr_t address, StreamHandle stream);
  // Graph pools: free the live block at `address` into a kept block; make a kept block live
  // again for `requested` bytes (false, nothing changed, while it waits for recorded
  // streams or lies on a page that is away: a paused region's); free a kept block for good (its
  // memory to the pending frees, as free() does).
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
  // What take_handle() came back with.
  enum class Take { taken, refused, spent };
  // A device handle of `npages` pages (a page, or an extent when more than one) from the
  // policy's own sources, cheapest first, never from the eviction engine: taken (*id is it);
  // refused (the driver refused an extent's size while capacity was there); spent (none of
  // those sources has one: only the engine can free a page, then ask again). A placement's
  // handles come from here (spent ends its step: needs_page), and so do a restore's: the space
  // asks here, asks the engine itself when spent, and hands the handle to the engine, so
  // neither an allocation nor a restore goes through the policy into the engine.
  Take take_handle(uint32_t npages, int32_t* id);
  // The handle sizes (in pages) a run of `npages` pages under one region gets when it is resumed:
  // extents of the size classes, largest first, as for a new block that covers them whole (one-page
  // handles without extents, or for a run shorter than the smallest extent run).
  std::vector<uint32_t> plan_handles(size_t npages) const { return handle_plan(npages, false, false); }
  // No extents from now on (a leased space's pages are the service's one-page pages).
  void disable_extents() { extent_max_pages_ = 0; }
  // Unmap the cached handle that has been cached longest; false when there is none.
  bool reclaim_one_handle();
  // Unmap every cached handle (trim).
  void unmap_cached();
  // Pages held above the capacity (a limit lowered under them): cached ones unmapped and released.
  void shed_over_limit();
  // At the edge of an OOM: split the extents blocks use only in part (alloc_policy_split.cpp)
  // until `npages` pages fit under capacity (a restore's handle, for `stream`, its consumer).
  // Whether any was split; none while `stream` captures a graph (a split waits for the device).
  bool split_extents_for_pages(uint64_t npages, StreamHandle stream);
  // Throw OutOfMemory with the numbers; `count`: one more in num_ooms (false: a shortage a try reports).
  [[noreturn]] void throw_oom(uint64_t requested, const char* why = nullptr, bool count = true);
  static uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

  // The blocks' records read as data (the eviction engine is handed this; the policy keeps the
  // records current and is never called back).
  const BlockFacts& facts() const { return facts_; }

  LiveAllocations& live() { return live_; }
  const LiveAllocations& live() const { return live_; }
  const PendingFrees& pending() const { return pending_; }
  const StreamUses& uses() const { return uses_; }
  // Some block (live, kept, pending or waiting) touches the virtual page at `va`.
  bool page_in_use(uintptr_t va) const { return !free_.is_free(va, page_bytes_); }
  size_t page_bytes() const { return page_bytes_; }
  uint64_t capacity() const { return capacity_; }
  // Bytes of the cached handles: mapped, and no block touches them.
  uint64_t cached_bytes() const { return cached_.pages() * page_bytes_; }
  // Mapped pages some block (live, kept or pending) touches: what invariant 1 counts.
  uint64_t touched_pages() const;
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
  // Where a block may go in the free space: anywhere the rules allow (any), only over pages
  // mapped already (mapped: no driver call), or page-aligned over unmapped pages only (fresh: it
  // needs ceil(bytes / page) pages and leaves every cached handle to be reclaimed).
  enum class Fit { any, mapped, fresh };
  // Free ranges the fewest-pages placement looks at before it settles for a fresh one.
  static constexpr size_t kFewestLooks = 256;
  // When the best fit cannot get its pages: the place that takes the fewest pages no other block
  // holds (unmapped, or under a cached handle: capacity either way), sharing the pages at its
  // ends with its neighbours where it can; never more than a fresh place (ceil(bytes / page)).
  uintptr_t take_fewest(uint64_t bytes);
  // The pages [at, at + bytes) would take from capacity: unmapped ones, and every page of a
  // cached handle under it (a handle is held whole).
  uint64_t pages_taken(uintptr_t at, uint64_t bytes) const;
  // Reuse before growth: while the cached handles hold more than an eighth of the pages blocks
  // use (and more than kCachedFloorPages), a new handle is taken from them rather than created
  // under capacity: the oldest of the size wanted, else the one cached longest if it is no larger
  // than the excess (released, its memory going to the handle made next).
  static constexpr uint64_t kCachedShare = 8;
  static constexpr uint64_t kCachedFloorPages = 4;
  // Unmap (and, if not of `npages`, release) the cached handle cached longest when the cached
  // handles exceed that allowance; whether one was.
  bool reuse_before_growth(uint32_t npages);
  bool take_mapped(uint64_t rounded, uintptr_t* out);
  // At the edge of an OOM: split until a block of `bytes` for `stream` fits its fewest-pages place.
  bool split_extents_for_bytes(uint64_t bytes, StreamHandle stream);
  // Run the placement from where it stands to the end of its step (begin_allocate's answers).
  Step advance(Placement& p);
  // Move on to the next fit of the order above (waiting for pending frees or splitting extents
  // where it says so) and take its range; false when none is left.
  bool next_fit(Placement& p);
  // The placement's range, mapped under it now: live, and done.
  Step make_live(Placement& p);
  // The place that take_fewest() would take and the pages it would take from capacity (a fresh
  // place, 0, when none takes fewer than ceil(bytes / page)).
  uint64_t find_fewest(uint64_t bytes, uintptr_t* at) const;
  // Take a free range for `bytes` (best fit), reserving more virtual space when none has room
  // (any, fresh); 0 when a mapped fit finds none.
  uintptr_t take_free(uint64_t bytes, Fit fit);
  void give_free(uintptr_t a, uint64_t bytes);
  // Where a block of `bytes` may start inside the free range [start, start + size): the lowest
  // usable address, or 0 when there is none.
  uintptr_t place(uintptr_t start, uint64_t size, uint64_t bytes, Fit fit) const;
  // 0 if a block may lie at [at, at + bytes); else the next address worth trying (past the
  // away page, the extent or the unmapped or mapped page in the way).
  uintptr_t blocked_until(uintptr_t at, uint64_t bytes, Fit fit) const;
  // The handle sizes (in pages) for a run of npages unmapped pages; `partial_first` and
  // `partial_last`: the block covers the run's first / last page only in part.
  std::vector<uint32_t> handle_plan(size_t npages, bool partial_first, bool partial_last) const;
  // Hold the free range at `at` for the placement and list the runs of unmapped pages under it.
  void hold_fit(Placement& p, uintptr_t at);
  // The handle plan of the placement's current run (one-page handles if `one_page`).
  void plan_run(Placement& p, bool one_page);
  // Map the placement's runs, from the current one on, each with handles of its plan mapped back
  // to back (all or nothing per run): mapped (all of them), needs_page (take_handle spent), or
  // dropped (no handle could be had: the fit is given back, drop_fit).
  enum class Mapping { mapped, needs_page, dropped };
  Mapping map_runs(Placement& p);
  // The current run got no handle: its handles go back. Whether it goes on with one-page handles
  // (`refused`: the driver refused an extent's size, and the plan was not one-page already).
  bool run_failed(Placement& p, bool refused);
  // The placement's fit failed: its runs mapped are unmapped and its range is free again.
  void drop_fit(Placement& p);
  void release_block(uintptr_t address, uint64_t size);
  // List or unlist the handles over [lo, hi) as cached.
  void refresh_cached(uintptr_t lo, uintptr_t hi);
  bool is_cached(int32_t id) const;
  uintptr_t page_of(uintptr_t a) const { return a - a % page_bytes_; }

  // Extent splits (alloc_policy_split.cpp). An extent that blocks touch only in part: its
  // runs of touched pages, what splitting it frees and costs in driver calls.
  struct Split {
    int32_t id = -1;
    uintptr_t va = 0;
    uint32_t npages = 0;
    uint32_t touched = 0;
    std::vector<std::pair<uintptr_t, uint32_t>> runs;  // (first page, pages) touched, in address order
    uint64_t calls = 0;                                // driver calls it is expected to take
  };
  // Pages a new handle may still take: capacity less what is held, plus the free (releasable)
  // and cached (reclaimable) handles.
  uint64_t room_pages() const;
  // Whether the mapped extent `id` at `va` may be split, and how (*s). Not when no block or every
  // page of it is touched, any page of it is away, a kept block (a graph pool's) is on it, or a
  // stream that may touch it is capturing a graph (it cannot be waited for).
  bool split_plan(int32_t id, uintptr_t va, Split* s) const;
  // Split until fits(room_pages()) or no extent is left to split; whether any was. Nothing is
  // split when splitting every candidate would still leave less than `most` pages of room.
  template <typename Fits>
  bool split_extents(uint64_t most, StreamHandle stream, Fits&& fits);
  // One split, with room for its touched pages under capacity beside the extent: new handles
  // mapped at the touched pages, the bytes copied from a second mapping of the extent. Stages
  // through host memory instead (split_staged) when the touched pages do not fit the room.
  // Whether it was split (false: no handle could be had; nothing changed).
  bool split_in_place(const Split& s);
  bool split_staged(const Split& s);
  // Handles for the touched runs (taken, unmapped): extents for long runs as for a new block,
  // one-page handles where the driver refuses an extent's size. False (nothing held) when spent.
  bool take_split_handles(const Split& s, std::vector<std::vector<int32_t>>* ids);
  void give_back_handles(std::vector<std::vector<int32_t>>* ids);
  // Unmap the handles of the first `mapped_runs` runs (keeping them taken), then give all back.
  void unmap_split_handles(std::vector<std::vector<int32_t>>* ids, size_t mapped_runs);
  // Release a split extent (taken, unmapped); if the driver refuses, it becomes a free handle.
  void release_split_extent(int32_t id);
  // Map the taken handle `id` at `va` again; false (still taken, unmapped) if the driver refuses.
  bool map_back(uintptr_t va, int32_t id);
  // The streams that may touch [va, va + bytes): its blocks' own and recorded streams, and the
  // streams of frees pending on its pages.
  std::vector<StreamHandle> streams_over(uintptr_t va, uint64_t bytes) const;
  // Wait on the host for all work on the device, every stream of the process (invariant 4): a
  // live block may be read on a stream the allocator never heard of (record_stream is only
  // asked for at a free), so the streams it knows do not bound who may touch the blocks moved.
  // False (nothing changed) when the driver refuses the wait.
  bool quiesce();

  Backend& backend_;
  PageTable& pages_;
  EventPool& events_;
  ResidencyPort* port_ = nullptr;
  uint64_t capacity_;
  size_t page_bytes_;
  uint64_t small_threshold_;
  uint64_t extent_max_pages_;  // the largest extent; 0 when extents are off
  uint64_t extent_min_pages_;  // runs of at least this many pages get extents
  LiveAllocations live_;
  PendingFrees pending_;
  StreamUses uses_;
  BlockFacts facts_{live_, pending_, uses_};  // after the records it reads
  FreeSpace free_;
  CachedHandles cached_;
  bool skip_free_wait_ = false;
  bool skip_quiesce_ = false;
  uint64_t num_ooms_ = 0;
  uint64_t num_page_reclaims_ = 0;
  uint64_t num_alloc_retries_ = 0;
  uint64_t num_sync_all_streams_ = 0;
  uint64_t num_extent_splits_ = 0;         // extents split (their blocks moved to handles of their own)
  uint64_t num_extent_splits_staged_ = 0;  // of those, staged through host memory
  uint64_t extent_split_pages_ = 0;        // touched pages whose bytes a split copied
  bool retried_ = false;  // this allocation reclaimed cached pages or waited for frees
  uint32_t region_ = 0;   // the region of the placement in progress (begin_allocate, resume): blocked_until reads it
  uint64_t limit_bytes_ = 0;
};

}  // namespace vta
