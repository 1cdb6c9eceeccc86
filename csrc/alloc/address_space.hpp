// AddressSpace: the allocation policy over one PageTable. What `malloc` and `free` do.
//
// Owns: live allocations, free virtual ranges (mapped = cached, unmapped), small-object
// slabs, frees waiting for their stream, and the statistics. One mutex guards all of it;
// no call ever enters Python.
// Policy, in order, for an allocation of n pages (large, > small_threshold):
//   1. best-fit among cached free ranges that still have pages mapped (no driver call);
//   2. best-fit among unmapped free ranges (reserving more VA if none fits), backed by
//      pages taken from the unmapped pool, created under capacity, or reclaimed: unmapped
//      from cached free ranges (invariant 1: no OOM while a cached page could serve);
//   3. wait for pending frees of other streams and retry; then OutOfMemory.
// Small allocations (<= small_threshold) are 512-byte blocks packed into one-page slabs.
// Invariants: every address is 512-byte aligned; allocations of a page or more are
// page-aligned; a page is unmapped only once the event recorded at its last free has
// completed (invariant 4); mapped pages never exceed capacity.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
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

  uintptr_t malloc(uint64_t nbytes, StreamHandle stream);
  void free(uintptr_t address);
  uint64_t size_of(uintptr_t address);
  void write(uintptr_t address, uint64_t offset, const void* src, uint64_t nbytes);
  void read(uintptr_t address, uint64_t offset, void* dst, uint64_t nbytes);
  uint64_t trim();
  void synchronize();
  // Leased mode (VTA_CONFIG_LEASED): pages come from the service, not from the backend.
  void import_page(int fd, uint64_t tag);
  std::vector<uint64_t> return_pages(uint64_t max_pages);
  void close();

  vta_stats_t stats();
  void reset_peak_stats();
  std::vector<vta_page_info_t> pages();
  std::vector<vta_alloc_info_t> allocations();
  int backend_kind() const { return backend_kind_; }
  int device() const { return device_; }

 private:
  struct Allocation {
    uint64_t size;       // rounded: 512-byte blocks, or whole pages
    uint64_t requested;
    StreamHandle stream;
    bool small;
  };
  struct PendingFree {
    uintptr_t address;
    uint64_t size;
    bool small;
    EventHandle event;
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
  void drain_pending_locked(bool wait);
  EventHandle take_event_locked();
  const Allocation& find_allocation_locked(uintptr_t address, uint64_t offset, uint64_t nbytes, uintptr_t* start);
  [[noreturn]] void throw_oom_locked(uint64_t requested);
  [[noreturn]] void throw_not_live_locked(uintptr_t address);
  void note_mapped_locked();

  mutable std::mutex mu_;
  bool closed_ = false;
  bool leased_ = false;
  std::unique_ptr<Backend> backend_;
  int backend_kind_;
  int device_;
  uint64_t capacity_;
  size_t page_bytes_;
  uint64_t small_threshold_;
  size_t reservation_bytes_;
  PageTable pages_;

  RangeSet free_mapped_;    // cached: free virtual ranges with pages still mapped
  RangeSet free_unmapped_;  // free virtual ranges with nothing mapped
  RangeSet small_free_;     // free 512-byte blocks inside slabs (never crosses a slab)
  std::unordered_map<uintptr_t, uint64_t> slab_used_;  // slab base -> live bytes in it
  uintptr_t spare_slab_ = 0;  // one empty slab kept for reuse (0 = none)
  std::map<uintptr_t, Allocation> live_;
  std::vector<PendingFree> pending_;
  std::vector<EventHandle> idle_events_;
  std::vector<EventHandle> all_events_;

  vta_stats_t stats_{};
};

}  // namespace vta
