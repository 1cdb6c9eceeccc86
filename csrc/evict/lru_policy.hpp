// LruPolicy: the core's victim policy, least recently used first (victim_policy.hpp).
//
// Owns: the order of the candidate pages, stored as runs, and an address index of the runs
// (which page is a candidate is decided by the engine, Residency::note_page). A run [lo, hi)
// stands for the pages lo, lo + page, ..., hi - page, in that order, next to each other in the
// LRU order: the page-by-page order is the runs' order, each run's pages ascending. A walk that
// notes the pages of an allocation in address order makes one run, not one entry per page, so
// forgetting a range (forget_range: a freed or evicted allocation) costs O(log runs + runs it
// overlaps), not one step per page.
// Invariants: each page at most once (runs never overlap in address); runs are non-empty and
// page-aligned; forget()/forget_range() of pages not listed does nothing; note_use() moves a
// listed page to the most recently used end; the order is exactly that of a list of pages
// under the same calls (runs only compress it); pages_ is the number of pages in the runs;
// touched_ counts the entries each call touched (a page noted, a run cut), never reset (tests).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <map>

#include "evict/victim_policy.hpp"

namespace vta {

class LruPolicy final : public VictimPolicy {
 public:
  explicit LruPolicy(size_t page_bytes) : page_(page_bytes) {}

  void note_use(uintptr_t va) override {
    forget(va);
    ++pages_;
    if (!order_.empty() && order_.back().hi == va) {  // continues the most recent run
      order_.back().hi += page_;
      return;
    }
    order_.push_back(Run{va, va + page_});  // most recently used: at the end
    by_addr_.emplace(va, std::prev(order_.end()));
  }
  void forget(uintptr_t va) override {
    ++touched_;
    cut(va, va + page_);
  }
  void forget_range(uintptr_t lo, uintptr_t hi) override { touched_ += cut(lo, hi); }
  void clear() override {
    order_.clear();
    by_addr_.clear();
    pages_ = 0;
  }
  bool visit(const std::function<bool(uintptr_t)>& take) const override {
    for (const Run& r : order_)
      for (uintptr_t va = r.lo; va < r.hi; va += page_)
        if (take(va)) return true;  // the runs may have changed: never advance past a taken page
    return false;
  }
  uint64_t candidate_pages() const override { return pages_; }
  uint64_t entries_touched() const override { return touched_; }

 private:
  struct Run {
    uintptr_t lo, hi;
  };
  using Order = std::list<Run>;

  // Drop the pages of [lo, hi) from the runs: a run it covers goes, one it cuts keeps the
  // pieces outside it, in its place in the order (left piece, then right piece). How many
  // runs it touched.
  uint64_t cut(uintptr_t lo, uintptr_t hi) {
    uint64_t runs = 0;
    if (lo >= hi) return 0;  // nothing to cut (a run at lo would otherwise be split at lo)
    auto it = by_addr_.upper_bound(lo);
    if (it != by_addr_.begin() && std::prev(it)->second->hi > lo) --it;  // the run lo falls in
    while (it != by_addr_.end() && it->first < hi) {
      Order::iterator run = it->second;
      const uintptr_t rlo = run->lo, rhi = run->hi;
      const uintptr_t cut_lo = std::max(rlo, lo), cut_hi = std::min(rhi, hi);
      ++runs;
      pages_ -= (cut_hi - cut_lo) / page_;
      if (cut_hi < rhi) {  // cut_hi == hi: the right piece's key ends the loop
        by_addr_.emplace(cut_hi, order_.insert(std::next(run), Run{cut_hi, rhi}));
      }
      if (rlo < cut_lo) {
        run->hi = cut_lo;
        ++it;
      } else {
        order_.erase(run);
        it = by_addr_.erase(it);
      }
    }
    return runs;
  }

  size_t page_;
  Order order_;                                 // least recently used first
  std::map<uintptr_t, Order::iterator> by_addr_;  // each run by its first page
  uint64_t pages_ = 0;
  uint64_t touched_ = 0;
};

}  // namespace vta
