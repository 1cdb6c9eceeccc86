// CachedHandles implementation.
//
// Owns: adding to and removing from the three indexes together.
// Invariants: those of cached_handles.hpp.
#include "alloc/cached_handles.hpp"

namespace vta {

void CachedHandles::add(int32_t id) {
  uintptr_t va = pages_.address_of(id);
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    if (it->second.va == va) return;  // listed already, where it is
    forget(id);
  }
  uint32_t n = pages_.pages_of(id);
  uint64_t seq = next_seq_++;
  entries_.emplace(id, Entry{seq, va, n});
  by_age_.emplace(seq, id);
  by_pages_[n].insert(seq);
  pages_listed_ += n;
}

void CachedHandles::forget(int32_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  const Entry& e = it->second;
  by_age_.erase(e.seq);
  auto bp = by_pages_.find(e.npages);
  bp->second.erase(e.seq);
  if (bp->second.empty()) by_pages_.erase(bp);
  pages_listed_ -= e.npages;
  entries_.erase(it);
}

void CachedHandles::clear() {
  entries_.clear();
  by_age_.clear();
  by_pages_.clear();
  pages_listed_ = 0;
}

}  // namespace vta
