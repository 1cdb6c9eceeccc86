// VirtualRanges: the free virtual ranges of one address space and how large ones are made.
//
// Owns: cached ranges (free, pages still mapped: reused with no driver call), unmapped
// ranges (free, nothing mapped), and the growth of virtual space by one more reservation.
// Invariants: a free range never crosses a reservation (both sets fence at every
// reservation's edges); a cached range is a run of whole handles (taken only at a handle
// boundary); a cached range's pages all hold no live or pending-free data and
// their events completed; map_range() is all-or-nothing: on failure every page it obtained
// and the range go back, and nothing is mapped.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/status.hpp"
#include "vmm/page_table.hpp"
#include "vmm/range_set.hpp"

namespace vta {

class VirtualRanges {
 public:
  VirtualRanges(PageTable& pages, size_t reservation_bytes) : pages_(pages), reservation_bytes_(reservation_bytes) {}

  // Best fit among cached ranges whose first `bytes` are whole handles: the pages are mapped
  // already (an extent is never split: the driver maps and unmaps it whole).
  bool take_cached(size_t bytes, uintptr_t* out) {
    return cached_.take_best_fit_if(
        bytes, [&](uintptr_t start, size_t n) { return pages_.handle_boundary(start + n); }, out);
  }
  // A page-aligned range backed by one handle of each size in `handles` (in pages, back to
  // back): best fit among unmapped ranges (reserving more virtual space if none fits), the
  // handles from obtain(uint32_t npages, int32_t* id), which returns false when none can be
  // had; false then (nothing changed).
  template <typename Obtain>
  bool map_range(const std::vector<uint32_t>& handles, Obtain&& obtain, uintptr_t* out);
  // Map handles of these sizes back to back at va (unmapped, taken out by the caller); all or
  // nothing: on failure every handle obtained goes back and false (or the exception) follows.
  template <typename Obtain>
  bool map_at(uintptr_t va, const std::vector<uint32_t>& handles, Obtain&& obtain);
  // Grow a cached range in place: the largest cached range (shorter than `bytes`) that an
  // unmapped range of the same reservation follows directly, together at least `bytes`. Both
  // pieces are taken out: the cached range keeps its pages mapped (no driver call) and only
  // the rest, `bytes - *cached` from *start + *cached, is left to map_growth(). False when no
  // such pair exists.
  bool take_growable(size_t bytes, uintptr_t* start, size_t* cached);
  // Map the rest of a range take_growable() gave, with handles of these sizes; all or nothing:
  // on failure both pieces go back where they were and false (or the exception) follows.
  template <typename Obtain>
  bool map_growth(uintptr_t start, size_t cached, size_t bytes, const std::vector<uint32_t>& handles,
                  Obtain&& obtain);
  // The last handle (a page or an extent) of the smallest cached range (the least useful
  // for reuse), taken out: its first virtual page and its bytes.
  bool take_cached_page(uintptr_t* va, size_t* bytes);
  // A cached extent of exactly npages that a cached range holds whole, taken out (its first
  // virtual page in *va); false when there is none.
  bool take_cached_extent(uint32_t npages, uintptr_t* va);
  // Unmap [va, va + bytes) (its pages become the page table's free pages); unmapped range.
  void unmap(uintptr_t va, size_t bytes);
  // Unmap every cached range (trim).
  void unmap_cached();

  void add_cached(uintptr_t va, size_t bytes) { cached_.insert(va, bytes); }
  void add_unmapped(uintptr_t va, size_t bytes) { unmapped_.insert(va, bytes); }
  void add(uintptr_t va, size_t bytes, bool mapped) { (mapped ? cached_ : unmapped_).insert(va, bytes); }
  size_t cached_bytes() const { return cached_.total_bytes(); }
  void clear();

 private:
  // Reserve at least min_bytes more virtual space, as one unmapped range.
  void grow(size_t min_bytes);

  PageTable& pages_;
  size_t reservation_bytes_;
  RangeSet cached_;    // free virtual ranges with pages still mapped
  RangeSet unmapped_;  // free virtual ranges with nothing mapped
};

template <typename Obtain>
bool VirtualRanges::map_range(const std::vector<uint32_t>& handles, Obtain&& obtain, uintptr_t* out) {
  size_t bytes = 0;
  for (uint32_t n : handles) bytes += n * pages_.page_bytes();
  uintptr_t va = 0;
  if (!unmapped_.take_best_fit(bytes, &va)) {
    grow(bytes);
    bool taken = unmapped_.take_best_fit(bytes, &va);
    VTA_INVARIANT(taken);
  }
  bool ok = false;
  try {
    ok = map_at(va, handles, obtain);
  } catch (...) {
    unmapped_.insert(va, bytes);
    throw;
  }
  if (!ok) {
    unmapped_.insert(va, bytes);
    return false;
  }
  *out = va;
  return true;
}

template <typename Obtain>
bool VirtualRanges::map_growth(uintptr_t start, size_t cached, size_t bytes, const std::vector<uint32_t>& handles,
                               Obtain&& obtain) {
  auto give_back = [&] {
    unmapped_.insert(start + cached, bytes - cached);
    cached_.insert(start, cached);
  };
  bool ok = false;
  try {
    ok = map_at(start + cached, handles, obtain);
  } catch (...) {
    give_back();
    throw;
  }
  if (!ok) give_back();
  return ok;
}

template <typename Obtain>
bool VirtualRanges::map_at(uintptr_t va, const std::vector<uint32_t>& handles, Obtain&& obtain) {
  std::vector<int32_t> ids;
  ids.reserve(handles.size());
  auto give_back = [&] {
    for (int32_t id : ids) pages_.return_page(id);
  };
  try {
    for (uint32_t n : handles) {
      int32_t id = -1;
      if (!obtain(n, &id)) {
        give_back();
        return false;
      }
      ids.push_back(id);
    }
    pages_.map_pages(va, ids);
  } catch (...) {
    give_back();
    throw;
  }
  return true;
}

}  // namespace vta
