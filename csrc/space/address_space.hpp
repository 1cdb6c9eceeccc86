// AddressSpace: the allocation policy and the eviction engine over one PageTable (being split: see csrc/alloc, csrc/evict).
//
// Owns: live allocations, free virtual ranges (mapped = cached, unmapped), small-object
// slabs, frees waiting for their stream, the residency of every virtual page whose bytes
// are not in a device page (evicted or in flight), the LRU of evictable pages, the host
// pool and the copy stream, and the statistics. One mutex guards all of it; no call ever
// enters Python.
//
// Allocation, in order, for n pages (large, > small_threshold):
//   1. best-fit among cached free ranges that still have pages mapped (no driver call);
//   2. best-fit among unmapped free ranges (reserving more VA if none fits), backed by
//      pages taken from the unmapped pool, created under capacity, reclaimed from cached
//      free ranges, freed by waiting for frees still pending on their streams, or freed by
//      evicting the least-recently-used evictable page (obtain_page_locked, in that order);
//   3. if pending frees completed meanwhile, retry once (a small request may now fit a
//      freed block); then OutOfMemory.
// Small allocations (<= small_threshold) are 512-byte blocks packed into one-page slabs.
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
// allocations, of frees pending on it and of its restore's consumers (quiesce_pages_locked).
// Those changes are batched so one wait covers many pages: releasing held device pages
// (obtain_page_locked, trim, synchronize, return_pages) and swapping restored pages in
// (ensure_resident, synchronize).
//
// Invariants: every address is 512-byte aligned; allocations of a page or more are
// page-aligned; addresses never change (eviction included); a device page is unmapped only
// once the events after its last use completed; mapped pages never exceed capacity; a
// failure at any step leaves the page where its bytes were and reports a typed error.
#pragma once

#include <chrono>
#include <deque>
#include <iterator>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "backend/fault_injection.hpp"
#include "evict/host_pool.hpp"
#include "vmm/page_table.hpp"
#include "vmm/range_set.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

constexpr uint64_t kMinAlignment = 512;
// Larger requests are refused as invalid: no device has this much memory to back them.
constexpr uint64_t kMaxAllocationBytes = 1ull << 46;

class AddressSpace {
 public:
  // Validates the config, creates the backend; throws Error on failure.
  static std::unique_ptr<AddressSpace> create(const vta_config_t& config);
  ~AddressSpace();

  // allow_evict: under pressure, evict least-recently-used evictable pages before failing.
  uintptr_t malloc(uint64_t nbytes, StreamHandle stream, bool allow_evict = true);
  void free(uintptr_t address);
  uint64_t size_of(uintptr_t address);
  void write(uintptr_t address, uint64_t offset, const void* src, uint64_t nbytes);
  void read(uintptr_t address, uint64_t offset, void* dst, uint64_t nbytes);
  uint64_t trim();
  void synchronize();
  void close();

  // Eviction engine (csrc/evict/residency.cpp).
  void set_evictable(uintptr_t address, bool evictable);
  void offload(uintptr_t address);
  void prefetch(uintptr_t address, const StreamHandle* stream);
  void ensure_resident(uintptr_t address, const StreamHandle* stream);
  int residency(uintptr_t address);
  void inject_fault(int op, int times);
  // Test support: deliberately break one ordering rule (VTA_DEBUG_BREAK_* bits), to show
  // that the stress tests catch it. Never set outside tests.
  void break_ordering(uint32_t mask);
  // Test hooks (csrc/alloc/address_space_test_hooks.cpp): streams of this space's own and
  // test kernels on them (host backend only; see backend/host_kernels.hpp).
  StreamHandle create_stream();
  void destroy_stream(StreamHandle stream);
  void synchronize_stream(StreamHandle stream);
  void run_test_kernel(StreamHandle stream, uintptr_t address, uint64_t nbytes, int kind, uint64_t seed,
                       uint64_t duration_ns);
  vta_kernel_counters_t kernel_counters();

  // Leased mode (VTA_CONFIG_LEASED): pages come from the service, not from the backend.
  void import_page(int fd, uint64_t tag);
  std::vector<uint64_t> return_pages(uint64_t max_pages);

  vta_stats_t stats();
  void reset_peak_stats();
  std::vector<vta_page_info_t> pages();
  std::vector<vta_alloc_info_t> allocations();
  int backend_kind() const { return backend_kind_; }
  int device() const { return device_; }

 private:
  using Clock = std::chrono::steady_clock;

  struct Allocation {
    uint64_t size;       // rounded: 512-byte blocks, or whole pages
    uint64_t requested;
    StreamHandle stream;
    bool small;
    bool evictable = false;
  };
  struct PendingFree {
    uintptr_t address;
    uint64_t size;
    bool small;
    EventHandle event;
  };
  enum class Residency : uint8_t { evicting, evicted, restoring, restored };
  // A virtual page (under live data) whose bytes are not, or not only, in a device page.
  struct AwayPage {
    Residency state;
    HostPool::Slot slot;       // where the bytes are, or are going
    int32_t device_page = -1;  // restoring/restored: the page being filled
    bool device_held = false;  // evicted: the device page is still mapped at the address
    bool host_mapped = false;  // mapped mode: slot.page is mapped at the virtual page
    bool window_mapped = false;  // mapped mode restore: device_page mapped at its window
    EventHandle event = 0;     // completes the in-flight copy
    std::vector<StreamHandle> consumers;  // restoring/restored: streams ordered after the copy
    Clock::time_point issued;
  };

  AddressSpace(std::unique_ptr<Backend> backend, const vta_config_t& config, uint64_t capacity, size_t page_bytes);

  void check_open_locked() const;
  // One attempt of the policy; false when out of memory (nothing changed).
  bool try_malloc_locked(uint64_t rounded, bool small, uintptr_t* out);
  // A page-aligned range of npages with pages mapped under it; false when out of memory.
  bool mapped_range_locked(size_t npages, uintptr_t* out);
  bool obtain_page_locked(int32_t* id);
  bool reclaim_one_page_locked();
  void grow_va_locked(size_t min_bytes);
  void release_block_locked(uintptr_t address, uint64_t size, bool small);
  void release_large_range_locked(uintptr_t address, uint64_t size);
  void drain_pending_locked(bool wait);
  // Whether `event` completed: waits for it if `wait`, else polls.
  bool event_done_locked(EventHandle event, bool wait);
  // Remove and return a slab's free blocks from small_free_.
  std::vector<std::pair<uintptr_t, uint64_t>> take_slab_blocks_locked(uintptr_t slab);
  EventHandle take_event_locked();
  void give_event_locked(EventHandle e) { idle_events_.push_back(e); }
  std::map<uintptr_t, Allocation>::iterator find_live_locked(uintptr_t address);
  const Allocation& find_allocation_locked(uintptr_t address, uint64_t offset, uint64_t nbytes);
  [[noreturn]] void throw_oom_locked(uint64_t requested, const char* why = nullptr);
  [[noreturn]] void throw_not_live_locked(uintptr_t address);
  void copy_bytes_locked(uintptr_t va, uintptr_t host, uint64_t n, StreamHandle stream, bool to_va);

  // Residency (csrc/evict/residency.cpp).
  void init_eviction(const vta_config_t& config);
  StreamHandle copy_stream_locked();
  template <typename F>
  void for_each_alloc_on_page_locked(uintptr_t va, F&& f);
  bool page_evictable_locked(uintptr_t va);
  void touch_page_locked(uintptr_t va);
  void touch_range_locked(uintptr_t start, uint64_t bytes);
  void lru_remove_locked(uintptr_t va);
  // Evict one resident page; false (nothing changed) when the host pool is full.
  bool evict_page_locked(uintptr_t va, bool wait);
  bool evict_lru_locked();
  void complete_evict_locked(uintptr_t va, AwayPage& p);
  void restore_page_locked(uintptr_t va, StreamHandle consumer);
  void complete_restore_locked(uintptr_t va, AwayPage& p);
  void finish_inflight_locked(uintptr_t va, bool wait);
  void drain_inflight_locked(bool wait);
  void drop_away_page_locked(uintptr_t va);
  // Add the streams of the page's allocations to `streams` (each once).
  void add_page_streams_locked(uintptr_t va, std::vector<StreamHandle>* streams);
  // Wait on the host until no work queued so far may touch these pages (see Ordering above).
  void quiesce_pages_locked(const std::vector<uintptr_t>& vas);
  // The addresses of the away pages that `pred` picks (a copy: callers change away_).
  template <typename F>
  std::vector<uintptr_t> away_where_locked(F&& pred) const;
  // Mapped mode: map the page's host copy at its address (host_mapped says whether it worked).
  void map_host_copy_locked(uintptr_t va, AwayPage& p);
  // Release the device pages that evicted pages still hold (one quiesce); how many.
  size_t release_evicted_locked();
  // Wait for every eviction copy still running; whether there was one.
  bool finish_evictions_locked();
  void release_held_page_locked(uintptr_t va, AwayPage& p);
  // Restored pages (mapped mode): one quiesce, then the device page replaces the host page.
  void swap_restored_locked();
  void swap_restored_page_locked(uintptr_t va, AwayPage& p);
  // An evicted page whose device page was never released becomes resident again (no copy).
  void unevict_held_locked(uintptr_t va);
  // A restored page goes back to evicted: its device page (at the window) returns to the pool.
  void unrestore_locked(AwayPage& p);
  // The page is resident again: forget it as away, give its slab its free blocks back, LRU.
  void finish_resident_locked(uintptr_t va);
  bool broken(uint32_t bit) const { return (debug_break_ & bit) != 0; }
  void prefetch_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer);
  void ensure_resident_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer);
  void stash_slab_locked(uintptr_t slab);
  void unstash_slab_locked(uintptr_t slab);
  uintptr_t page_of(uintptr_t a) const { return a - a % page_bytes_; }
  // Mapped mode restore: where device page `id` is filled before the swap.
  uintptr_t window_of(int32_t id) const { return window_ + static_cast<uintptr_t>(id) * page_bytes_; }
  void release_eviction_locked();

  mutable std::mutex mu_;
  bool closed_ = false;
  bool leased_ = false;
  std::unique_ptr<FaultInjectingBackend> backend_;
  int backend_kind_;
  int device_;
  uint64_t capacity_;
  size_t page_bytes_;
  uint64_t small_threshold_;
  size_t reservation_bytes_;
  PageTable pages_;

  RangeSet free_mapped_;    // cached: free virtual ranges with pages still mapped
  RangeSet free_unmapped_;  // free virtual ranges with nothing mapped
  RangeSet small_free_;     // free 512-byte blocks inside resident slabs (never crosses a slab)
  std::unordered_map<uintptr_t, uint64_t> slab_used_;  // slab base -> live bytes in it
  std::unordered_map<uintptr_t, std::vector<std::pair<uintptr_t, uint64_t>>> slab_stash_;  // evicted slabs' free blocks
  uintptr_t spare_slab_ = 0;  // one empty slab kept for reuse (0 = none)
  std::map<uintptr_t, Allocation> live_;
  // Frees waiting for their stream, one FIFO per stream: events recorded on one stream
  // complete in order, so a drain stops at the first incomplete event of each stream.
  std::unordered_map<StreamHandle, std::deque<PendingFree>> pending_;
  uint64_t pending_count_ = 0;
  uint64_t pending_released_ = 0;  // frees that completed their wait, ever (malloc retries after one)
  std::vector<EventHandle> idle_events_;
  std::vector<EventHandle> all_events_;

  // Eviction engine state.
  bool mapped_mode_ = false;
  uint64_t host_capacity_ = 0;
  std::unique_ptr<HostPool> host_pool_;
  StreamHandle copy_stream_ = 0;
  bool copy_stream_made_ = false;
  std::unordered_map<uintptr_t, AwayPage> away_;
  uint64_t in_flight_ = 0;
  std::list<uintptr_t> lru_;  // evictable resident pages, least recently used first
  std::unordered_map<uintptr_t, std::list<uintptr_t>::iterator> lru_pos_;
  uintptr_t pin_lo_ = 0, pin_hi_ = 0;  // pages of the allocation being made resident
  bool evict_allowed_ = true;          // this malloc may evict (set for the call, under mu_)
  uintptr_t window_ = 0;               // mapped mode: device pages' window reservation
  size_t window_bytes_ = 0;
  uint64_t evictable_bytes_ = 0;
  uint32_t debug_break_ = 0;  // VTA_DEBUG_BREAK_* bits (tests only)
  std::vector<StreamHandle> user_streams_;  // test hooks: created by create_stream()

  vta_stats_t stats_{};
};

template <typename F>
std::vector<uintptr_t> AddressSpace::away_where_locked(F&& pred) const {
  std::vector<uintptr_t> vas;
  for (auto& [va, p] : away_)
    if (pred(p)) vas.push_back(va);
  return vas;
}

// Calls f(address, allocation) for each live allocation overlapping [va, va + page).
template <typename F>
void AddressSpace::for_each_alloc_on_page_locked(uintptr_t va, F&& f) {
  auto it = live_.lower_bound(va);
  if (it != live_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > va) f(prev->first, prev->second);
  }
  for (; it != live_.end() && it->first < va + page_bytes_; ++it) f(it->first, it->second);
}

}  // namespace vta
