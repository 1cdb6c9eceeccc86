// RangeSet: a set of disjoint free address ranges with best-fit lookup and coalescing.
//
// Owns: nothing but bookkeeping (no driver calls). Used for free virtual ranges (page
// granular) and for free blocks inside small-object slabs (512-byte granular).
// Invariants: ranges are disjoint and non-empty; two ranges that touch are merged unless a
// fence separates them: a multiple of `boundary` (slabs) or a registered fence address
// (reservation edges), so no range ever crosses a slab or a reservation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

namespace vta {

class RangeSet {
 public:
  explicit RangeSet(size_t boundary = 0) : boundary_(boundary) {}

  // Ranges are never merged across a fence address.
  void add_fence(uintptr_t at) { fences_.insert(at); }
  void remove_fence(uintptr_t at) { fences_.erase(at); }

  void insert(uintptr_t start, size_t bytes) {
    uintptr_t end = start + bytes;
    auto right = by_addr_.find(end);
    if (right != by_addr_.end() && can_merge(end)) {
      end += right->second;
      erase_it(right);
    }
    auto left = by_addr_.lower_bound(start);
    if (left != by_addr_.begin()) {
      --left;
      if (left->first + left->second == start && can_merge(start)) {
        start = left->first;
        erase_it(left);
      }
    }
    put(start, end - start);
  }

  // Take `bytes` from the start of the smallest range that holds them.
  bool take_best_fit(size_t bytes, uintptr_t* out) {
    return take_best_fit_if(bytes, [](uintptr_t, size_t) { return true; }, out);
  }

  // The same among the ranges for which may_cut(start, bytes) holds: whether the range
  // starting at `start` may give up its first `bytes` (the page table's handles are cut whole).
  template <typename MayCut>
  bool take_best_fit_if(size_t bytes, MayCut&& may_cut, uintptr_t* out) {
    auto it = by_size_.lower_bound({bytes, 0});
    while (it != by_size_.end() && !may_cut(it->second, bytes)) ++it;
    if (it == by_size_.end()) return false;
    uintptr_t start = it->second;
    size_t have = it->first;
    erase_it(by_addr_.find(start));
    if (have > bytes) put(start + bytes, have - bytes);
    *out = start;
    return true;
  }

  // Remove exactly [start, start+bytes), which must lie inside one range.
  bool take_exact(uintptr_t start, size_t bytes) {
    auto it = by_addr_.upper_bound(start);
    if (it == by_addr_.begin()) return false;
    --it;
    uintptr_t r_start = it->first, r_end = it->first + it->second;
    if (start < r_start || start + bytes > r_end) return false;
    erase_it(it);
    if (start > r_start) put(r_start, start - r_start);
    if (start + bytes < r_end) put(start + bytes, r_end - (start + bytes));
    return true;
  }

  // The smallest range, if any (for reclaiming the least useful cached memory first).
  bool smallest(uintptr_t* start, size_t* bytes) const {
    if (by_size_.empty()) return false;
    *bytes = by_size_.begin()->first;
    *start = by_size_.begin()->second;
    return true;
  }

  // The largest range, if any.
  bool largest(uintptr_t* start, size_t* bytes) const {
    if (by_size_.empty()) return false;
    *bytes = by_size_.rbegin()->first;
    *start = by_size_.rbegin()->second;
    return true;
  }

  bool contains(uintptr_t start, size_t bytes) const {
    auto it = by_addr_.upper_bound(start);
    if (it == by_addr_.begin()) return false;
    --it;
    return start >= it->first && start + bytes <= it->first + it->second;
  }

  bool empty() const { return by_addr_.empty(); }
  size_t count() const { return by_addr_.size(); }
  size_t total_bytes() const { return total_; }
  const std::map<uintptr_t, size_t>& ranges() const { return by_addr_; }
  void clear() {
    by_addr_.clear();
    by_size_.clear();
    total_ = 0;
  }

 private:
  bool can_merge(uintptr_t at) const {
    if (boundary_ && at % boundary_ == 0) return false;
    return fences_.count(at) == 0;
  }
  void put(uintptr_t start, size_t bytes) {
    by_addr_.emplace(start, bytes);
    by_size_.emplace(bytes, start);
    total_ += bytes;
  }
  void erase_it(std::map<uintptr_t, size_t>::iterator it) {
    by_size_.erase({it->second, it->first});
    total_ -= it->second;
    by_addr_.erase(it);
  }

  size_t boundary_;
  std::set<uintptr_t> fences_;
  std::map<uintptr_t, size_t> by_addr_;
  std::set<std::pair<size_t, uintptr_t>> by_size_;
  size_t total_ = 0;
};

}  // namespace vta
