// Residency: the eviction engine of one address space, composed of small parts.
//
// Owns: the transitions of away pages (the state machine below) and the decisions that drive
// them: which pages may be victims, what is asked of the engine for one allocation. It
// implements the policy's ResidencyPort. Its parts, each in a file of its own:
//  - AwayPages (away_pages.*): the away pages and their states, bookkeeping only;
//  - StreamOrder (stream_order.*): the copy stream, the copies and every wait that orders them
//    and the mapping changes (quiesce);
//  - HostPool (host_pool.*): the host slots that hold evicted bytes;
//  - RestoreWindow (restore_window.*): which ranges of mapped mode's restore window are in use;
//  - EvictionCounters (eviction_counters.hpp): the totals of the stats;
//  - VictimPolicy (victim_policy.hpp; LruPolicy, lru_policy.hpp): the order of the victims.
// What it needs to know of the blocks over a page (their streams, which bytes hold data,
// whether they may be evicted or paused) it reads as data from BlockFacts (blocks/
// block_facts.hpp: the records the policy keeps current, read-only here); it never calls the
// policy and includes nothing of csrc/alloc (tests/test_one_way_loop.py). The device handles it
// restores into are given to it (the space obtains them from the policy), and it frees a device
// page only when the space asks (free_device_page), never for the policy from inside it: calls
// go one way, into the engine. Every call is made under the address space's lock.
//
// The engine decides which mapping changes and when; the PageTable, the one owner of every
// reservation, handle and mapping, makes the change: map_pages / unmap_range for device pages,
// map_side / unmap_side for a host copy at an away page's address and for the windows (whose
// reservations and host-located handles are the PageTable's too). evict/ calls the backend only
// for copies, streams, events, pinned host memory and its capabilities (tests/test_mapping_owner.py).
//
// One class in three .cpp files, and why: the transitions (residency.cpp), the work asked for
// one allocation (residency_ops.cpp) and victim choice (residency_victims.cpp) call each other
// both ways (choosing a victim evicts it; a page made resident becomes a candidate again;
// offload and restore walk an allocation through the transitions); classes of their own would
// each need the others back, a loop inside the engine instead of one owner of the away pages'
// transitions.
//
// A handle may lie under several blocks (pages are shared between neighbouring allocations):
// it moves whole, so it is evicted only when every allocation on it may be (marked evictable,
// or the one being offloaded), and it comes back whole when any of them is made resident.
//
// Page residency (per virtual page under live data):
//   resident -> evicting -> evicted -> restoring [-> restored] -> resident
// evicting: a copy to the host pool is queued on the copy stream after events recorded on
// the streams of the page's allocations. evicted: the bytes are safe in the host pool; the
// device page stays mapped at the address ("held") until memory is needed, so nothing
// changes under work that may still read it. restoring: a fresh device page receives the
// bytes; the consumer stream waits on the copy; in copy mode the page is mapped at its
// (unmapped) address before the copy, in mapped mode it is filled through a window address.
// restored (mapped mode): the copy completed; the host page is swapped out for it later.
//
// Ordering (invariant 4, docs/eviction.md): the mapping under an address that live or
// pending-free data occupies changes only after a host-side wait for events recorded, at the
// time of the change, on every stream that may touch the page: the streams of its
// allocations, of frees pending on it and of its restore's consumers (quiesce_pages, through
// StreamOrder::quiesce). Those changes are batched so one wait covers many pages: releasing
// held device pages (free_device_page, trim, synchronize, return_pages) and swapping restored
// pages in (ensure_resident, synchronize).
//
// Invariants: addresses never change (eviction included); every transition that fails
// part-way leaves the bytes where they were: a failed copy or map undoes its own steps
// before the error propagates, and the page keeps its previous state; a device page is
// unmapped only once the events after its last use completed; used host slots never exceed
// host_capacity.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "blocks/block_facts.hpp"
#include "blocks/residency_port.hpp"
#include "evict/away_pages.hpp"
#include "evict/eviction_counters.hpp"
#include "evict/host_pool.hpp"
#include "evict/lru_policy.hpp"
#include "evict/restore_window.hpp"
#include "evict/stream_order.hpp"
#include "evict/victim_policy.hpp"
#include "vmm/event_pool.hpp"
#include "vmm/page_table.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

class Residency final : public ResidencyPort {
 public:
  using Clock = std::chrono::steady_clock;
  using AwayPage = vta::AwayPage;
  using State = AwayPage::State;

  // Validates evict_mode, chooses the mode and sizes the host pool; throws Error.
  Residency(const vta_config_t& config, Backend& backend, PageTable& pages, EventPool& events, const BlockFacts& facts,
            uint64_t capacity);
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  // Memory is short and the policy's sources are spent (the space asks, between two steps of an
  // allocation or of a restore): make a device page free, in this order: release the device
  // pages that evicted pages still hold (one wait for their streams), else finish the eviction
  // copies still running (their pages are held next), else, if `may_evict`, evict the evictable
  // handle its victim policy picks (least recently used first), else give back the device page
  // of a restore made ahead of need (a prefetch). Never a page of [keep_lo, keep_hi) (whole
  // pages): the block being placed, or the allocation being made resident. False when none of
  // these could be done (nothing changed); true means "take a handle again".
  bool free_device_page(bool may_evict, uintptr_t keep_lo, uintptr_t keep_hi);

  // ResidencyPort.
  bool any_away() const override { return !away_.empty(); }
  bool is_away(uintptr_t va) const override { return away_.first_of(va) != 0; }
  bool away_span(uintptr_t va, uintptr_t* first, uint64_t* bytes) const override;
  void drop_away_page(uintptr_t first) override;
  void note_use(uintptr_t start, uint64_t bytes) override;
  void note_left(uintptr_t start, uint64_t bytes) override;
  // Tests only: the victim policy's candidate pages now and entries touched so far.
  void victim_counters(uint64_t* candidate_pages, uint64_t* entries_touched) const {
    *candidate_pages = victims_->candidate_pages();
    *entries_touched = victims_->entries_touched();
  }
  uint64_t host_pool_used_bytes() const override { return host_pool_.used_bytes(); }
  uint64_t host_pool_capacity_bytes() const override { return host_pool_.capacity_bytes(); }

  // Complete the copies that finished (waiting for each if `wait`).
  void drain_inflight(bool wait);
  // Release the device pages that evicted pages still hold (one quiesce); how many.
  size_t release_evicted();
  // Restored pages (mapped mode): one quiesce, then the device page replaces the host page.
  void swap_restored();

  // Work over the pages of one live allocation [start, start + bytes) (residency_ops.cpp).
  // Copy between [va, va + n) and host memory wherever the bytes are, restoring nothing.
  void copy_bytes(uintptr_t va, uintptr_t host, uint64_t n, StreamHandle stream, bool to_va);
  // Evict every handle under the allocation that no allocation not marked evictable shares
  // (the others stay resident); the bytes of the allocation now away. InvalidArgument when
  // sharing keeps every one of its handles resident; HostPoolExhausted when the pool is full.
  uint64_t offload(uintptr_t start, uint64_t bytes);
  // Restoring, in steps the space drives (the engine obtains no memory itself):
  // begin_restore() makes resident at once every page of the allocation whose device handle was
  // never released; next_to_restore() walks its away pages from *cursor: it orders `consumer`
  // after those in flight, and stops at the next one that needs a device handle (its first page
  // and pages); restore_page() fills handle `id` (of those pages, from the caller) with its
  // bytes, and owns the handle from then on. The space, short of a handle, calls
  // free_device_page() keeping the allocation. finish_restore() then waits for the copies and
  // swaps the restored pages in (ensure_resident).
  void begin_restore(uintptr_t start, uint64_t bytes);
  bool next_to_restore(uintptr_t* cursor, uintptr_t end, StreamHandle consumer, uintptr_t* first, uint32_t* npages);
  void restore_page(uintptr_t first, int32_t id, StreamHandle consumer);
  void finish_restore(uintptr_t start, uint64_t bytes);
  int residency_of(uintptr_t start, uint64_t bytes) const;  // VTA_RESIDENT / VTA_EVICTED / VTA_IN_FLIGHT / VTA_PAUSED
  uint64_t away_bytes(uintptr_t start, uint64_t bytes) const;  // bytes of [start, start + bytes) on away pages

  // Regions (residency_pause.cpp): a region's pages paused (off the device, their addresses
  // unmapped in both modes, the bytes in host slots or discarded) and resumed (back at the same
  // addresses), a batch at a time: its copies go as copy runs (copy_runs.hpp) on the copy stream,
  // then one wait; its mapping changes come after one quiesce.
  // pause(): every handle under `spans` (a region's allocations, in address order: start, bytes)
  // that only blocks of `region` hold leaves the device: copied to host slots (none if
  // `discard`), then unmapped; its ids are appended to *freed (the space releases them, or gives
  // them back). Away pages there (offloaded before) join the pause (discard drops their copies).
  // Nothing changes until the copies completed: a host pool too small (HostPoolExhausted) or a
  // refused copy leaves every page resident, with its bytes.
  struct PauseResult {
    uint64_t page_bytes = 0;    // device page bytes the pause took off the device (unmapped)
    uint64_t copied_bytes = 0;  // bytes copied to host slots
    uint64_t kept_bytes = 0;    // allocation bytes on handles shared with other regions' blocks (stay resident)
  };
  PauseResult pause(const std::vector<std::pair<uintptr_t, uint64_t>>& spans, uint32_t region, bool discard,
                    std::vector<int32_t>* freed);
  // Resume, in two steps (the engine obtains no memory itself): paused_stretches() lists the
  // paused away pages under `spans` as stretches of adjacent virtual pages (a paused page whose
  // device page was never unmapped is resident again at once, with no copy); the space takes
  // handles for each stretch (any sizes that add up to it: extents where it is long enough, so a
  // region whose small blocks had one-page handles comes back on a few extents); resume() maps
  // each stretch's handles back to back (one set-access per stretch), copies the bytes back (copy
  // runs; none for a discarded page), waits once and makes the pages resident: the device page
  // bytes brought back. The handles are the engine's from the call on: on an error they go back
  // to the free handles and every page stays paused.
  struct Stretch {
    uintptr_t va;
    uint32_t npages;
  };
  std::vector<Stretch> paused_stretches(const std::vector<std::pair<uintptr_t, uint64_t>>& spans);
  uint64_t resume(const std::vector<Stretch>& stretches, const std::vector<std::vector<int32_t>>& ids);
  // Some page of [start, start + bytes) is paused (touching it before a resume is refused).
  bool paused_over(uintptr_t start, uint64_t bytes) const;
  // The bytes of [start, start + bytes) on paused pages, and of those on discarded ones.
  void paused_bytes(uintptr_t start, uint64_t bytes, uint64_t* paused, uint64_t* discarded) const;
  uint64_t paused_pages() const { return paused_pages_; }

  const AwayPages& away() const { return away_; }  // by first page
  // The away page over virtual page `va` (any of its pages), its first page in *first; or null.
  const AwayPage* away_at(uintptr_t va, uintptr_t* first = nullptr) const { return away_.over(va, first); }
  // The eviction fields of the stats. pages_resident: the caller's count of mapped pages
  // under no free range, less the device pages evicted pages still hold (no data of theirs).
  void fill_stats(vta_stats_t* s) const;
  // Test support: VTA_DEBUG_BREAK_QUIESCE / VTA_DEBUG_BREAK_COPY_ORDER bits.
  void set_debug_break(uint32_t mask) { order_.set_debug_break(mask); }
  // Wait for in-flight copies and give back everything held (close()); the first error.
  void close();

 private:
  // What free_device_page() keeps: whole pages from lo.
  struct Kept {
    uintptr_t lo = 0, hi = 0;
    bool overlaps(uintptr_t va, uint64_t bytes) const { return va < hi && va + bytes > lo; }
  };
  uintptr_t page_of(uintptr_t a) const { return a - a % page_bytes_; }
  uint64_t bytes_of(const AwayPage& p) const { return away_.bytes_of(p); }

  // Before the pages of an allocation move again (offload, pause): the away page over `va` with
  // its copy completed and, restored, sent back to evicted. True while it is still away (evicting
  // or evicted: its first page and bytes in *first, *span); false when `va` is resident (never
  // away, or a copy-mode restore that completed).
  bool settled_away(uintptr_t va, uintptr_t* first, uint64_t* span);
  // Walk the handles under [start, start + bytes) in address order, each settled first
  // (settled_away): on_away(first) for an away page, on_handle(id, first page, bytes) for a
  // resident handle (the one before it may be the same: neighbours share handles).
  template <typename OnAway, typename OnHandle>
  void for_each_handle_to_move(uintptr_t start, uint64_t bytes, OnAway&& on_away, OnHandle&& on_handle) {
    for (uintptr_t va = page_of(start); va < start + bytes;) {
      uintptr_t first = 0;
      uint64_t span = 0;
      if (settled_away(va, &first, &span)) {
        on_away(first);
        va = first + span;
        continue;
      }
      int32_t id = pages_.page_at(va);
      VTA_INVARIANT(id >= 0);
      va = pages_.address_of(id) + pages_.bytes_of(id);
      on_handle(id, pages_.address_of(id), pages_.bytes_of(id));
    }
  }
  // f(first, page) for each away page over [start, start + bytes), in address order, until f
  // returns false.
  template <typename F>
  void for_each_away(uintptr_t start, uint64_t bytes, F&& f) const {
    for (uintptr_t va = page_of(start); va < start + bytes;) {
      uintptr_t first = 0;
      const AwayPage* p = away_at(va, &first);
      if (!p) {
        va += page_bytes_;
        continue;
      }
      va = first + bytes_of(*p);
      if (!f(first, *p)) return;
    }
  }

  // Transitions (residency.cpp).
  // Evict one resident page; false (nothing changed) when the host pool is full.
  bool evict_page(uintptr_t va, bool wait);
  void complete_evict(uintptr_t va, AwayPage& p);
  void complete_restore(uintptr_t va, AwayPage& p);
  void finish_inflight(uintptr_t va, bool wait);
  // Wait on the host until no work queued so far may touch these away pages (see Ordering above).
  void quiesce_pages(const std::vector<uintptr_t>& vas);
  // Mapped mode: map the page's host copy at its address (host_mapped says whether it worked).
  void map_host_copy(uintptr_t va, AwayPage& p);
  // Wait for every eviction copy still running; whether there was one.
  bool finish_evictions();
  void release_held_page(uintptr_t va, AwayPage& p);
  // Mapped mode: unmap a restore's device handle from the window and free its window range.
  void unmap_window(AwayPage& p);
  void swap_restored_page(uintptr_t va, AwayPage& p);
  // An evicted page whose device page was never released becomes resident again (no copy).
  void unevict_held(uintptr_t va);
  // A restored page goes back to evicted: its device page (at the window) returns to the free pages.
  void unrestore(AwayPage& p);
  // The page is resident again: forget it as away, a victim candidate again if evictable.
  void finish_resident(uintptr_t va);
  // A paused page whose device page was never unmapped (a pause that failed part-way) is resident again.
  void unpause_held(uintptr_t va);

  // Victim choice (residency_victims.cpp): which pages are candidates is decided here, their
  // order by victims_.
  void note_page(uintptr_t va);
  bool evict_victim(const Kept& kept);
  // Under pressure, after the victim policy: a prefetched restore outside `kept` gives its device page back.
  bool give_back_prefetched(const Kept& kept);

  Backend& backend_;
  PageTable& pages_;
  const BlockFacts& facts_;
  size_t page_bytes_;
  bool mapped_mode_;
  HostPool host_pool_;
  StreamOrder order_;
  RestoreWindow window_;
  AwayPages away_;
  EvictionCounters counters_;
  uint64_t in_flight_ = 0;  // pages of away pages being evicted or restored
  uint64_t paused_pages_ = 0;  // pages of paused away pages
  std::unique_ptr<VictimPolicy> victims_ = std::make_unique<LruPolicy>(page_bytes_);  // the candidates, best victim first
};

}  // namespace vta
