// AwayPages: the table of away pages and its index of their other pages (see away_pages.hpp).
//
// Owns: nothing beyond away_pages.hpp's table.
// Invariants: those of away_pages.hpp; add() and erase() keep the index and the table together.
#include "evict/away_pages.hpp"

namespace vta {

uintptr_t AwayPages::first_of(uintptr_t va) const {
  uintptr_t page = page_of(va);
  if (map_.count(page)) return page;
  auto it = first_.find(page);
  return it == first_.end() ? 0 : it->second;
}

const AwayPage* AwayPages::over(uintptr_t va, uintptr_t* first) const {
  uintptr_t f = first_of(va);
  if (!f) return nullptr;
  if (first) *first = f;
  return &map_.at(f);
}

AwayPage* AwayPages::find(uintptr_t first) {
  auto it = map_.find(first);
  return it == map_.end() ? nullptr : &it->second;
}

AwayPage& AwayPages::add(uintptr_t first, const AwayPage& p) {
  for (uint32_t k = 1; k < p.npages; ++k) first_[first + k * page_bytes_] = first;
  return map_[first] = p;
}

void AwayPages::erase(uintptr_t first) {
  auto it = map_.find(first);
  for (uint32_t k = 1; k < it->second.npages; ++k) first_.erase(first + k * page_bytes_);
  map_.erase(it);
}

void AwayPages::clear() {
  map_.clear();
  first_.clear();
}

void AwayPages::count(uint64_t* evicted, uint64_t* held, uint64_t* restored) const {
  *evicted = *held = *restored = 0;
  for (auto& [va, p] : map_) {
    if (p.state == AwayPage::State::evicted) *evicted += p.npages;
    if (p.state == AwayPage::State::evicted && p.device_held) *held += p.npages;
    if (p.state == AwayPage::State::restored) *restored += p.npages;
  }
}

}  // namespace vta
