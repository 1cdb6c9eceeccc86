// LruPolicy: the core's victim policy, least recently used first (victim_policy.hpp).
//
// Owns: the order of the candidate pages and a position index (which page is a candidate is
// decided by the engine, Residency::note_page).
// Invariants: each page at most once; forget() of a page not listed does nothing; note_use()
// moves a listed page to the most recently used end.
#pragma once

#include <cstdint>
#include <iterator>
#include <list>
#include <unordered_map>

#include "evict/victim_policy.hpp"

namespace vta {

class LruPolicy final : public VictimPolicy {
 public:
  void note_use(uintptr_t va) override {
    forget(va);
    order_.push_back(va);  // most recently used: at the end
    pos_[va] = std::prev(order_.end());
  }
  void forget(uintptr_t va) override {
    auto it = pos_.find(va);
    if (it == pos_.end()) return;
    order_.erase(it->second);
    pos_.erase(it);
  }
  void clear() override {
    order_.clear();
    pos_.clear();
  }
  bool visit(const std::function<bool(uintptr_t)>& take) const override {
    for (auto it = order_.begin(); it != order_.end(); ++it)
      if (take(*it)) return true;  // the list may have changed: never advance past a taken page
    return false;
  }

 private:
  std::list<uintptr_t> order_;
  std::unordered_map<uintptr_t, std::list<uintptr_t>::iterator> pos_;
};

}  // namespace vta
