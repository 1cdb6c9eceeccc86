// CachedHandles: the mapped handles that no block touches, oldest first.
//
// Owns: the list of cached handles (mapped handles whose whole virtual range is free: no live,
// kept or pending block touches any of their pages, and none of them is away) in the order they
// became cached, with an index by size for extents.
// Invariants: the caller refreshes every range whose blocks or mappings change, so a handle is
// listed iff it was cached at the last refresh over it; a take re-checks the handle before
// handing it out and drops a stale entry instead, so a handle taken is always cached; pages()
// is the sum of the listed handles' pages.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>

#include "vmm/page_table.hpp"

namespace vta {

class CachedHandles {
 public:
  explicit CachedHandles(const PageTable& pages) : pages_(pages) {}
  CachedHandles(const CachedHandles&) = delete;
  CachedHandles& operator=(const CachedHandles&) = delete;

  // Every handle mapped over a virtual page of [lo, hi) is listed iff cached(id) says so.
  template <typename Cached>
  void refresh(uintptr_t lo, uintptr_t hi, Cached&& cached);
  // The handle is about to be unmapped (or released): off the list.
  void forget(int32_t id);
  // The oldest listed handle (of exactly `npages` pages, if npages > 0) that is still
  // cached, taken off the list; false when there is none.
  template <typename Cached>
  bool take_oldest(uint32_t npages, Cached&& cached, int32_t* id);
  // The handle listed longest, left on the list (it may be stale: check it); false if none.
  bool peek_oldest(int32_t* id) const {
    if (by_age_.empty()) return false;
    *id = by_age_.begin()->second;
    return true;
  }
  uint64_t pages() const { return pages_listed_; }
  bool empty() const { return entries_.empty(); }
  void clear();

 private:
  struct Entry {
    uint64_t seq;
    uintptr_t va;  // where it was mapped when listed: a handle since moved is stale
    uint32_t npages;
  };
  void add(int32_t id);

  const PageTable& pages_;
  uint64_t next_seq_ = 0;
  uint64_t pages_listed_ = 0;
  std::unordered_map<int32_t, Entry> entries_;
  std::map<uint64_t, int32_t> by_age_;                      // seq -> id, oldest first
  std::map<uint32_t, std::set<uint64_t>> by_pages_;         // npages -> seqs
};

template <typename Cached>
void CachedHandles::refresh(uintptr_t lo, uintptr_t hi, Cached&& cached) {
  size_t page = pages_.page_bytes();
  for (uintptr_t va = lo - lo % page; va < hi;) {
    int32_t id = pages_.page_at(va);
    if (id < 0) {
      va += page;
      continue;
    }
    if (cached(id))
      add(id);
    else
      forget(id);
    va = pages_.address_of(id) + pages_.bytes_of(id);
  }
}

template <typename Cached>
bool CachedHandles::take_oldest(uint32_t npages, Cached&& cached, int32_t* id) {
  for (;;) {
    uint64_t seq = 0;
    if (npages == 0) {
      if (by_age_.empty()) return false;
      seq = by_age_.begin()->first;
    } else {
      auto it = by_pages_.find(npages);
      if (it == by_pages_.end() || it->second.empty()) return false;
      seq = *it->second.begin();
    }
    int32_t candidate = by_age_.at(seq);
    Entry e = entries_.at(candidate);
    forget(candidate);
    if (pages_.address_of(candidate) == e.va && pages_.pages_of(candidate) == e.npages && cached(candidate)) {
      *id = candidate;
      return true;
    }
  }
}

}  // namespace vta
