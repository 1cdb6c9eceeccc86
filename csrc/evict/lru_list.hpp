// LruList: the evictable resident virtual pages, least recently used first.
//
// Owns: the order and a position index (no policy: which page belongs here is decided by
// Residency::touch_page).
// Invariants: each page at most once; remove() of a page not listed does nothing.
#pragma once

#include <cstdint>
#include <iterator>
#include <list>
#include <unordered_map>

namespace vta {

class LruList {
 public:
  void remove(uintptr_t va) {
    auto it = pos_.find(va);
    if (it == pos_.end()) return;
    order_.erase(it->second);
    pos_.erase(it);
  }
  // Most recently used: at the end. The page must not be listed.
  void push_back(uintptr_t va) {
    order_.push_back(va);
    pos_[va] = std::prev(order_.end());
  }
  std::list<uintptr_t>::const_iterator begin() const { return order_.begin(); }
  std::list<uintptr_t>::const_iterator end() const { return order_.end(); }
  bool empty() const { return order_.empty(); }
  void clear() {
    order_.clear();
    pos_.clear();
  }

 private:
  std::list<uintptr_t> order_;
  std::unordered_map<uintptr_t, std::list<uintptr_t>::iterator> pos_;
};

}  // namespace vta
