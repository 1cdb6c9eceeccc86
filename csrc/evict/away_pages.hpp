// AwayPages: the away pages of one address space, and which one each virtual page lies in.
//
// Owns: one AwayPage per away handle (docs/design.md, glossary: the virtual pages of one handle
// under live data whose bytes are not, or not only, in a device handle), keyed by its first
// virtual page, and an index from each of its other virtual pages (an extent's) to that first
// page; the states an away page passes through. Bookkeeping only: no driver call, no copy and
// no policy; the transitions between the states are Residency's (residency.cpp).
// Invariants: away pages never overlap; each virtual page of an away page other than its first
// is in the index, pointing at the first, and nothing else is; an AwayPage's fields record what
// the transitions did to it so far (each step as it succeeds), so a failure part-way can be
// undone. Every call is made under the address space's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "blocks/block_facts.hpp"
#include "backend/backend.hpp"
#include "evict/host_pool.hpp"

namespace vta {

// The virtual pages of one handle, from its first page (the key in AwayPages) for `npages`
// pages, whose bytes are not, or not only, in a device handle.
struct AwayPage {
  // resident -> evicting -> evicted -> restoring [-> restored] -> resident (residency.hpp).
  enum class State : uint8_t { evicting, evicted, restoring, restored };
  State state;
  uint32_t npages = 1;
  HostPool::Slots slots;       // where the bytes are, or are going (npages pages; mapped mode: one)
  std::vector<ByteRange> live;  // the bytes copied out and back (live data at the eviction); empty: all
  int32_t device_page = -1;    // restoring/restored: the page being filled
  bool device_held = false;    // evicted: the device page is still mapped at the address
  bool host_mapped = false;    // mapped mode: slots[0].page is mapped at the virtual pages
  bool window_mapped = false;  // mapped mode restore: device_page mapped at `window`
  // A region's page paused (residency_pause.cpp): evicted, its address unmapped (no host copy
  // mapped there in either mode) until the region is resumed, and restored by nothing else.
  // While a resume is under way, device_page is the handle it took for the page (not mapped yet).
  bool paused = false;
  bool discarded = false;      // paused with no copy: no slots, the bytes are gone (pause's discard)
  uintptr_t window = 0;
  EventHandle event = 0;                // completes the in-flight copy
  std::vector<StreamHandle> consumers;  // restoring/restored: streams ordered after the copy
  std::chrono::steady_clock::time_point issued;
};

class AwayPages {
 public:
  using Map = std::unordered_map<uintptr_t, AwayPage>;

  explicit AwayPages(size_t page_bytes) : page_bytes_(page_bytes) {}

  // The first page of the away page over virtual page `va` (any of its pages), or 0.
  uintptr_t first_of(uintptr_t va) const;
  // The away page over `va` (any of its pages), its first page in *first; or null.
  const AwayPage* over(uintptr_t va, uintptr_t* first = nullptr) const;
  // The away page whose first page is `first` (not any of its pages), or null.
  AwayPage* find(uintptr_t first);
  AwayPage& at(uintptr_t first) { return map_.at(first); }
  const AwayPage& at(uintptr_t first) const { return map_.at(first); }
  bool starts_at(uintptr_t first) const { return map_.count(first) != 0; }
  // Start tracking / forget the away page at `first` (and its other pages in the index).
  AwayPage& add(uintptr_t first, const AwayPage& p);
  void erase(uintptr_t first);
  void clear();
  bool empty() const { return map_.empty(); }
  uint64_t bytes_of(const AwayPage& p) const { return uint64_t{p.npages} * page_bytes_; }
  // The bytes its copies move each way: its live ranges, or the whole handle.
  uint64_t copied_bytes_of(const AwayPage& p) const {
    if (p.live.empty()) return bytes_of(p);
    uint64_t n = 0;
    for (const ByteRange& r : p.live) n += r.bytes;
    return n;
  }
  // The first pages of the away pages that `pred` picks (a copy: callers change the pages).
  template <typename F>
  std::vector<uintptr_t> where(F&& pred) const;
  // Pages (not handles) evicted (paused ones too), of them with the device page still held, and restored.
  void count(uint64_t* evicted, uint64_t* held, uint64_t* restored) const;
  // By first page, in no particular order (the stats' page listing).
  Map::const_iterator begin() const { return map_.begin(); }
  Map::const_iterator end() const { return map_.end(); }

 private:
  uintptr_t page_of(uintptr_t a) const { return a - a % page_bytes_; }

  size_t page_bytes_;
  Map map_;                                         // by first page
  std::unordered_map<uintptr_t, uintptr_t> first_;  // other pages of multi-page away pages
};

template <typename F>
std::vector<uintptr_t> AwayPages::where(F&& pred) const {
  std::vector<uintptr_t> vas;
  for (auto& [va, p] : map_)
    if (pred(p)) vas.push_back(va);
  return vas;
}

}  // namespace vta
