// RangeSet: a set of disjoint free address ranges with best-fit lookup and coalescing.
//
// Owns: nothing but bookkeeping (no driver calls). Used for the free virtual space (512-byte
// granular), the host pool's free pieces and the restore windows.
// Invariants: ranges are disjoint and non-empty; two ranges that touch are merged unless a
// fence separates them: a multiple of `boundary` (when one is given) or a registered fence address
// (reservation edges), so no range ever crosses a reservation.
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
    return take_best_fit_placed(bytes, [](uintptr_t start, size_t) { return start; }, out);
  }

  // Best fit with a placement: the smallest range of at most `most` bytes in which
  // place(start, size) names a position `at` (start <= at, at + bytes <= start + size; 0: none
  // in this range) for `bytes`; [at, at + bytes) is taken out and what is left on either side
  // stays.
  template <typename Place>
  bool take_best_fit_placed(size_t bytes, Place&& place, uintptr_t* out, size_t most = SIZE_MAX) {
    for (auto it = by_size_.lower_bound({bytes, 0}); it != by_size_.end() && it->first <= most; ++it) {
      uintptr_t at = place(it->second, it->first);
      if (!at) continue;
      uintptr_t start = it->second;
      size_t have = it->first;
      erase_it(by_addr_.find(start));
      if (at > start) put(start, at - start);
      if (at + bytes < start + have) put(at + bytes, start + have - (at + bytes));
      *out = at;
      return true;
    }
    return false;
  }

  // Visit the ranges of at least `bytes`, smallest first, while f(start, size) returns true.
  template <typename F>
  void for_each_at_least(size_t bytes, F&& f) const {
    for (auto it = by_size_.lower_bound({bytes, 0}); it != by_size_.end(); ++it)
      if (!f(it->second, it->first)) return;
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

  // The range that holds [start, start + bytes) whole: its start and size; false if none.
  bool find(uintptr_t start, size_t bytes, uintptr_t* range_start, size_t* range_bytes) const {
    auto it = by_addr_.upper_bound(start);
    if (it == by_addr_.begin()) return false;
    --it;
    if (start < it->first || start + bytes > it->first + it->second) return false;
    *range_start = it->first;
    *range_bytes = it->second;
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
