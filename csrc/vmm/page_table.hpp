// PageTable: reservations of virtual space, the physical pages an address space holds, and
// which page is mapped where.
//
// Owns: every reservation, page handle and mapping of one address space, and the driver
// calls that create or destroy them. Holds no policy: which range to use and when to
// reclaim is decided in alloc/.
// Invariants:
//  - pages held <= capacity_pages; a page is either mapped at exactly one page-aligned
//    address inside a reservation, or unmapped and listed among the free pages;
//  - map_pages() is all-or-nothing: on any failure the pages mapped so far are unmapped
//    and returned to the free pages (RAII guard), so no mapping or page leaks;
//  - after release_all() nothing is held: no page, mapping or reservation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>
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

  // Take a held, unmapped page, or create one while under capacity. False when neither is
  // possible (at capacity, or the driver is out of memory). Throws on other driver errors.
  bool acquire_page(int32_t* id);
  // Give an acquired page back to the free pages without mapping it.
  void return_page(int32_t id);

  // Map pages[i] at va + i * page_bytes and make the range accessible. All or nothing.
  void map_pages(uintptr_t va, const std::vector<int32_t>& ids);
  // Unmap the whole pages in [va, va + bytes); their pages become free pages.
  void unmap_range(uintptr_t va, size_t bytes);

  int32_t page_at(uintptr_t va) const;
  int32_t new_slot(PageHandle handle, uint64_t tag);  // -1 when nothing is mapped there
  uintptr_t address_of(int32_t id) const { return pages_[id].va; }
  PageHandle handle_of(int32_t id) const { return pages_[id].handle; }
  uint64_t tag_of(int32_t id) const { return pages_[id].tag; }

  // Give every unmapped page back to the driver; returns the bytes released.
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
  void reset_peak() { peak_pages_mapped_ = pages_mapped_; }
  uint64_t pages_unmapped() const { return free_pages_.size(); }

  // Visit every held page: (id, mapped address or 0).
  template <typename F>
  void for_each_page(F&& f) const {
    for (size_t i = 0; i < pages_.size(); ++i)
      if (pages_[i].held) f(static_cast<int32_t>(i), pages_[i].va);
  }

 private:
  struct Page {
    PageHandle handle = 0;
    uintptr_t va = 0;   // 0 when unmapped
    bool held = false;  // this slot holds a live page handle
    uint64_t tag = 0;   // the service's id of a leased page (0 for pages created here)
  };

  Backend& backend_;
  size_t page_bytes_;
  uint64_t capacity_pages_;
  std::vector<Page> pages_;
  std::vector<int32_t> free_slots_;  // unused slots in pages_
  std::vector<int32_t> free_pages_;   // held, unmapped pages
  std::unordered_map<uintptr_t, int32_t> mapped_;  // page-aligned va -> page id
  std::map<uintptr_t, size_t> reservations_;
  uint64_t reserved_bytes_ = 0;
  uint64_t pages_held_ = 0;
  uint64_t pages_mapped_ = 0;
  uint64_t peak_pages_mapped_ = 0;  // every mapping counts: allocations, restores
};

}  // namespace vta
