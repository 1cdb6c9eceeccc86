// HostPool: host slots for evicted bytes (see host_pool.hpp).
//
// Owns: nothing beyond host_pool.hpp's.
// Invariants: those of host_pool.hpp; a step that fails part-way gives back what it took.
#include "evict/host_pool.hpp"

#include <unistd.h>

#include <algorithm>

namespace vta {

namespace {
constexpr uint64_t kChunkBytes = 64ull << 20;  // pinned memory is allocated 64 MiB at a time (or one slot's worth)
}

// The machine's memory comes from sysconf, never from an iostream: the core must not touch
// the C++ locale machinery (see docs/design.md, "No iostreams in the core or the binding").
uint64_t HostPool::default_capacity(uint64_t device_capacity) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  uint64_t limit = pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) / 2 : 0;
  uint64_t want = device_capacity * 4;
  return limit ? std::min(want, limit) : want;
}

HostPool::HostPool(Backend& backend, PageTable& pages, uint64_t capacity_bytes, bool mapped)
    : backend_(backend),
      pages_(pages),
      page_(pages.page_bytes()),
      capacity_(capacity_bytes / page_ * page_),
      mapped_(mapped) {}

HostPool::~HostPool() {
  try {
    release_all();
  } catch (...) {
  }
}

bool HostPool::grow_pinned(uint64_t bytes) {
  if (held_ + bytes > capacity_) return false;
  uint64_t chunk = std::min<uint64_t>(std::max<uint64_t>(kChunkBytes / page_ * page_, bytes), capacity_ - held_);
  void* p = nullptr;
  Status s = backend_.host_alloc_pinned(chunk, &p);
  if (s.code() == VTA_ERR_OUT_OF_MEMORY) return false;
  check(s);
  chunks_.push_back({p, chunk});
  held_ += chunk;
  uintptr_t at = reinterpret_cast<uintptr_t>(p);
  free_pinned_.add_fence(at);  // a slot never crosses a chunk
  free_pinned_.add_fence(at + chunk);
  free_pinned_.insert(at, chunk);
  return true;
}

bool HostPool::release_empty_chunks() {
  bool any = false;
  for (size_t i = 0; i < chunks_.size();) {
    auto [p, n] = chunks_[i];
    uintptr_t at = reinterpret_cast<uintptr_t>(p);
    if (!free_pinned_.contains(at, n)) {
      ++i;
      continue;
    }
    check(backend_.host_free_pinned(p, n));
    free_pinned_.take_exact(at, n);
    free_pinned_.remove_fence(at);
    free_pinned_.remove_fence(at + n);
    held_ -= n;
    chunks_.erase(chunks_.begin() + static_cast<std::ptrdiff_t>(i));
    any = true;
  }
  return any;
}

bool HostPool::create_mapped(uint32_t npages, Slot* out) {
  uint64_t bytes = uint64_t{npages} * page_;
  if (!window_) {
    window_bytes_ = 2 * capacity_;  // room for slots of mixed sizes
    window_ = pages_.reserve_window(window_bytes_);
    free_window_.insert(window_, window_bytes_);
  }
  created_.reserve(created_.size() + 1);  // before the page exists: recording it cannot throw then
  uintptr_t at = 0;
  if (!free_window_.take_best_fit(bytes, &at)) return false;
  PageHandle h = 0;
  Status s = pages_.create_host_handle(bytes, &h);
  if (!s.is_ok()) {
    free_window_.insert(at, bytes);
    if (s.code() == VTA_ERR_OUT_OF_MEMORY) return false;
    check(s);
  }
  Status m = pages_.map_side(at, bytes, h);  // all or nothing
  if (!m.is_ok()) {
    (void)pages_.release_host_handle(h);
    free_window_.insert(at, bytes);
    check(m);
  }
  *out = Slot{at, h, npages};
  created_.push_back(*out);
  held_ += bytes;
  return true;
}

void HostPool::destroy_mapped(const Slot& s) {
  uint64_t bytes = uint64_t{s.npages} * page_;
  check(pages_.unmap_side(s.addr, bytes));
  check(pages_.release_host_handle(s.page));
  free_window_.insert(s.addr, bytes);
  held_ -= bytes;
  created_.erase(std::find_if(created_.begin(), created_.end(), [&](const Slot& c) { return c.addr == s.addr; }));
}

bool HostPool::acquire(uint32_t npages, Slots* out) {
  out->clear();
  if (used_bytes() + uint64_t{npages} * page_ > capacity_) return false;
  Slot run;
  if (acquire_run(npages, &run)) {
    out->push_back(run);
    return true;
  }
  // Copy mode: the free pinned memory is there but in pieces (slots of mixed sizes).
  return !mapped_ && acquire_pieces(npages, out);
}

bool HostPool::acquire_run(uint32_t npages, Slot* out) {
  uint64_t bytes = uint64_t{npages} * page_;
  if (!mapped_) {
    uintptr_t at = 0;
    if (!free_pinned_.take_best_fit(bytes, &at)) {
      if (!grow_pinned(bytes) && !(release_empty_chunks() && grow_pinned(bytes))) return false;
      bool taken = free_pinned_.take_best_fit(bytes, &at);
      VTA_INVARIANT(taken);
    }
    *out = Slot{at, 0, npages};
  } else {
    auto same = std::find_if(free_slots_.begin(), free_slots_.end(), [&](const Slot& s) { return s.npages == npages; });
    if (same != free_slots_.end()) {
      *out = *same;
      free_slots_.erase(same);
    } else {
      // Room under capacity: give back unused slots of other sizes first.
      while (held_ + bytes > capacity_ && !free_slots_.empty()) {
        destroy_mapped(free_slots_.back());
        free_slots_.pop_back();
      }
      if (held_ + bytes > capacity_ || !create_mapped(npages, out)) return false;
    }
  }
  used_pages_ += npages;
  return true;
}

bool HostPool::acquire_pieces(uint32_t npages, Slots* out) {
  // Largest free piece first (fewest copies), then what a new chunk can add.
  uint32_t left = npages;
  while (left > 0) {
    uintptr_t start = 0;
    size_t have = 0;
    uint32_t take = 0;
    if (free_pinned_.largest(&start, &have) && have >= page_) {
      take = static_cast<uint32_t>(std::min<uint64_t>(left, have / page_));
    } else if (grow_pinned(std::min<uint64_t>(uint64_t{left} * page_, capacity_ - held_) / page_ * page_)) {
      continue;
    }
    Slot piece;
    if (take == 0 || !acquire_run(take, &piece)) {
      release(*out);
      out->clear();
      return false;
    }
    out->push_back(piece);
    left -= take;
  }
  return true;
}

void HostPool::release(const Slots& slots) {
  for (const Slot& s : slots) release_one(s);
}

void HostPool::release_one(const Slot& slot) {
  if (mapped_)
    free_slots_.push_back(slot);
  else
    free_pinned_.insert(slot.addr, uint64_t{slot.npages} * page_);
  used_pages_ -= slot.npages;
}

uintptr_t HostPool::address_at(const Slots& slots, uint64_t offset) const {
  for (const Slot& s : slots) {
    uint64_t bytes = uint64_t{s.npages} * page_;
    if (offset < bytes) return s.addr + offset;
    offset -= bytes;
  }
  VTA_INVARIANT(false && "offset beyond the slots");
  return 0;
}

void HostPool::release_all() {
  Status first;
  auto keep = [&](const Status& s) {
    if (!s.is_ok() && first.is_ok()) first = s;
  };
  for (auto& [p, n] : chunks_) keep(backend_.host_free_pinned(p, n));
  chunks_.clear();
  free_pinned_ = RangeSet();
  for (const Slot& s : created_) {
    keep(pages_.unmap_side(s.addr, uint64_t{s.npages} * page_));
    keep(pages_.release_host_handle(s.page));  // legal while still mapped: its memory lives until the unmap
  }
  created_.clear();
  free_slots_.clear();
  free_window_ = RangeSet();
  if (window_) keep(pages_.free_window(window_));
  window_ = 0;
  held_ = used_pages_ = 0;
  check(first);
}

}  // namespace vta
