// PageTable: reservations of virtual space, the physical pages an address space holds, and
// which page is mapped where.
//
// Owns: every reservation, physical handle and mapping of one address space, and the driver
// calls that create or destroy them: no other part of the core calls the backend's reserve,
// free_va, map, unmap or set_access, and evict/ creates and releases no handle itself
// (tests/test_mapping_owner.py). Holds no policy: which range to use and when to reclaim is
// decided in alloc/, which pages move and when in evict/.
//
// A handle is one driver allocation (cuMemCreate; a memfd range on the host backend) of one
// page or of an extent: several pages in one handle, which backs a large allocation so that
// it is mapped, unmapped and moved with one driver call per handle instead of one per page
// (docs/eviction.md, "Extents"). The driver maps a handle whole (no offset into it), so an
// extent is always mapped at one run of consecutive virtual pages and unmapped whole. Every
// count here (capacity, held, mapped, free) is in pages: an extent of n pages counts n.
//
// Besides the pages in its books, it holds what mapped eviction needs apart from them
// (page_table_side.cpp; no page count includes any of it): windows (reservations of their own,
// not among reservations()), host-located handles (host slots) and side mappings: a host slot's
// handle in the host pool's window or at an away page's virtual pages, a restore's device
// handle in the restore window.
//
// Invariants:
//  - pages held <= capacity_pages; a handle is either mapped at exactly one page-aligned
//    address inside a reservation, or unmapped and listed among the free handles;
//  - map_pages() is all-or-nothing: on any failure the handles mapped so far are unmapped
//    and returned to the free handles (RAII guard), so no mapping or handle leaks;
//  - unmap_range() covers whole handles only;
//  - a virtual page shows at most one mapping: a side mapping lies inside a window, or inside
//    a reservation where no page of the books is mapped, and overlaps no other side mapping;
//    map_side() is all-or-nothing too;
//  - after release_all() nothing is held: no handle, mapping, reservation or window.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <string>
#include <vector>

#include "backend/backend.hpp"

namespace vta {

class PageTable {
 public:
  PageTable(Backend& backend, size_t page_bytes, uint64_t capacity_bytes);
  PageTable(const PageTable&) = delete;
  PageTable& operator=(const PageTable&) = delete;

  size_t page_bytes() const { return page_bytes_; }
  uint64_t capacity_pages() const { return capacity_pages_; }

  // Reserve a new range of virtual addresses (a multiple of page_bytes). Throws on failure.
  uintptr_t reserve(size_t bytes);
  const std::map<uintptr_t, size_t>& reservations() const { return reservations_; }
  uint64_t reserved_bytes() const { return reserved_bytes_; }

  // Take a held, unmapped one-page handle, or create one while under capacity. False when
  // neither is possible (at capacity, or the driver is out of memory). Throws on other errors.
  bool acquire_page(int32_t* id);
  // The same for an extent of exactly `npages` pages (> 1). False at capacity, or when the
  // driver refused that size (*driver_oom then tells the caller one-page handles may still work).
  bool acquire_extent(uint32_t npages, int32_t* id, bool* driver_oom);
  // Give an acquired handle back to the free handles without mapping it.
  void return_page(int32_t id);
  // Release one free (held, unmapped) handle to the driver.
  void release_free(int32_t id);
  // Release free handles (no mapping changes) until `npages` more pages fit under capacity;
  // one-page handles first when `pages_first`, else extents first. Whether any was released.
  bool release_free_for(uint64_t npages, bool pages_first);

  // [va, va + bytes) lies inside one reservation made by reserve().
  bool inside_reservation(uintptr_t va, uint64_t bytes) const;
  // Map handles ids[0], ids[1], ... back to back from va and make the range accessible (one
  // set-access call). All or nothing; the range must lie inside one reservation (an internal
  // error before any driver call otherwise: the driver would not refuse it).
  void map_pages(uintptr_t va, const std::vector<int32_t>& ids);
  // Unmap the whole handles in [va, va + bytes); they become free handles.
  void unmap_range(uintptr_t va, size_t bytes);

  // Splitting an extent (alloc/alloc_policy_split.cpp), driver steps with no policy in them:
  // map the mapped handle `id` a second time at `alias` (page-aligned, inside a reservation, with
  // nothing mapped there) and make it accessible, all or nothing; the alias is outside the books
  // (page_at and every count ignore it: it holds no page of its own), so it must be unmapped with
  // unmap_alias() before anything else is mapped there.
  void map_alias(uintptr_t alias, int32_t id);
  void unmap_alias(uintptr_t alias, int32_t id);
  // Unmap the mapped handle `id` whole and keep it taken (in no free list): the caller maps it
  // again (map_pages), gives it back (return_page) or releases it (release_taken).
  void unmap_taken(int32_t id);
  // Release a taken handle (held, unmapped, in no free list) to the driver. If the driver
  // refuses, the handle is still taken and the error propagates.
  void release_taken(int32_t id);

  // Side mappings (page_table_side.cpp). A window is a reservation of `bytes` of its own,
  // apart from reservations() and reserved_bytes(), where handles are mapped at addresses only
  // copies use: mapped eviction's host slots (HostPool) and the device handles restores fill
  // (RestoreWindow). Throws on failure.
  uintptr_t reserve_window(size_t bytes);
  // Give a window back; forgotten even when the driver refuses, whose error is returned. A side
  // mapping still in it (an unmap the driver refused, its error reported then) keeps it until
  // release_all().
  Status free_window(uintptr_t va);
  // A host-located handle of `bytes` (a mapped-mode host slot); the driver's error returned.
  Status create_host_handle(size_t bytes, PageHandle* out);
  Status release_host_handle(PageHandle handle);
  // Map `handle` at [va, va + bytes) and make it accessible, all or nothing: on a refused
  // set-access the map is undone (RAII guard). The range lies inside a window, or inside a
  // reservation with no page of the books mapped there (an away page's host copy), and overlaps
  // no side mapping (an internal error, before any driver call, otherwise). The driver's error
  // is returned: nothing is mapped then.
  Status map_side(uintptr_t va, uint64_t bytes, PageHandle handle);
  // Unmap the side mapping made at exactly [va, va + bytes); when the driver refuses it stays.
  Status unmap_side(uintptr_t va, uint64_t bytes);

  int32_t page_at(uintptr_t va) const;  // the handle mapped over this virtual page, or -1
  // A cut between the virtual pages before and at `va` splits no mapped handle.
  bool handle_boundary(uintptr_t va) const;
  int32_t new_slot(PageHandle handle, uint64_t tag, uint32_t npages = 1);
  // The reason the driver last refused to create a page (out of memory, or out of descriptors
  // on the host backend), cleared when taken: an out-of-memory error carries it.
  std::string take_driver_refusal();
  uintptr_t address_of(int32_t id) const { return pages_[id].va; }  // first virtual page, or 0
  uint32_t pages_of(int32_t id) const { return pages_[id].npages; }
  uint64_t bytes_of(int32_t id) const { return uint64_t{pages_[id].npages} * page_bytes_; }
  PageHandle handle_of(int32_t id) const { return pages_[id].handle; }
  uint64_t tag_of(int32_t id) const { return pages_[id].tag; }

  // Give every unmapped handle back to the driver; returns the bytes released.
  uint64_t release_free_pages();

  // Leased pages: adopt a page created elsewhere (capacity grows by one page), and give
  // unmapped pages back (capacity shrinks), reporting the tags they were adopted with.
  void adopt_page(PageHandle handle, uint64_t tag);
  std::vector<uint64_t> give_back_pages(uint64_t max_pages);
  // Some held page was adopted with `tag` (tags name leased pages: import refuses a second).
  bool holds_tag(uint64_t tag) const;
  void set_capacity_pages(uint64_t n) { capacity_pages_ = n; }
  // Unmap and release everything and free every reservation (close()).
  void release_all();

  uint64_t pages_held() const { return pages_held_; }
  uint64_t pages_mapped() const { return pages_mapped_; }
  uint64_t peak_pages_mapped() const { return peak_pages_mapped_; }
  uint64_t peak_pages_held() const { return peak_pages_held_; }
  void reset_peak() {
    peak_pages_mapped_ = pages_mapped_;
    peak_pages_held_ = pages_held_;
  }
  uint64_t pages_unmapped() const { return free_page_count_; }
  // Pages that became held (created or imported) and that were released, ever.
  uint64_t pages_adopted_total() const { return pages_adopted_total_; }
  uint64_t pages_released_total() const { return pages_released_total_; }
  uint64_t extents_held() const { return extents_held_; }

  // Visit every mapped extent: (id, its first virtual page).
  template <typename F>
  void for_each_mapped_extent(F&& f) const {
    for (auto& [va, id] : mapped_extents_) f(id, va);
  }
  // Visit the mapped extents that overlap [lo, hi), in address order: (id, its first virtual page).
  template <typename F>
  void for_each_mapped_extent_in(uintptr_t lo, uintptr_t hi, F&& f) const {
    auto it = mapped_extents_.lower_bound(lo);
    if (it != mapped_extents_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + bytes_of(prev->second) > lo) it = prev;
    }
    for (; it != mapped_extents_.end() && it->first < hi; ++it) f(it->second, it->first);
  }

  // Visit every page of every held handle: (id, the page's index k in its handle, the page's
  // mapped address or 0).
  template <typename F>
  void for_each_page(F&& f) const {
    for (size_t i = 0; i < pages_.size(); ++i) {
      const Page& p = pages_[i];
      if (!p.held) continue;
      for (uint32_t k = 0; k < p.npages; ++k) f(static_cast<int32_t>(i), k, p.va ? p.va + k * page_bytes_ : 0);
    }
  }

 private:
  struct Page {
    PageHandle handle = 0;
    uintptr_t va = 0;     // first virtual page it is mapped at; 0 when unmapped
    bool held = false;    // this slot holds a live handle
    uint32_t npages = 1;  // 1: a page; more: an extent
    uint64_t tag = 0;     // the service's id of a leased page (0 for pages created here)
  };

  void release_slot(int32_t id);  // release the (unmapped, free) handle and forget it
  // new_slot that releases `handle` if it cannot be recorded: a created page is held or gone.
  int32_t new_slot_or_release(PageHandle handle, uint64_t tag, uint32_t npages);
  bool release_one_free(bool extents);
  void push_free(int32_t id);
  // [va, va + bytes) lies inside one of `ranges` (base -> bytes).
  static bool inside(const std::map<uintptr_t, size_t>& ranges, uintptr_t va, uint64_t bytes);
  // A side mapping overlaps [va, va + bytes).
  bool side_overlaps(uintptr_t va, uint64_t bytes) const;
  // Unmap the side mappings, release the host-located handles and free the windows still held
  // (what evict/'s close could not give back), keeping the first error in *first.
  void release_side(Status* first);

  Backend& backend_;
  size_t page_bytes_;
  uint64_t capacity_pages_;
  std::vector<Page> pages_;
  std::vector<int32_t> free_slots_;    // unused slots in pages_
  std::vector<int32_t> free_pages_;    // held, unmapped one-page handles
  std::string driver_refusal_;         // see take_driver_refusal()
  std::vector<int32_t> free_extents_;  // held, unmapped extents
  std::vector<int32_t> extent_ids_;    // every held extent
  uint64_t free_page_count_ = 0;       // pages in free_pages_ and free_extents_
  std::unordered_map<uintptr_t, int32_t> mapped_;  // every mapped virtual page -> its handle
  std::map<uintptr_t, int32_t> mapped_extents_;     // every mapped extent, by its first virtual page
  std::map<uintptr_t, size_t> reservations_;
  std::map<uintptr_t, size_t> windows_;           // reservations for side mappings: base -> bytes
  std::map<uintptr_t, uint64_t> side_;            // side mappings: first address -> bytes
  std::unordered_set<PageHandle> host_handles_;   // host-located handles created here
  uint64_t reserved_bytes_ = 0;
  uint64_t pages_held_ = 0;
  uint64_t extents_held_ = 0;
  uint64_t pages_mapped_ = 0;
  uint64_t peak_pages_mapped_ = 0;  // every mapping counts: allocations, restores
  uint64_t peak_pages_held_ = 0;    // PyTorch's peak reserved bytes, in pages
  uint64_t pages_adopted_total_ = 0, pages_released_total_ = 0;
};

}  // namespace vta
