// HostPool implementation; see host_pool.hpp.
#include "evict/host_pool.hpp"

#include <algorithm>

namespace vta {

namespace {
constexpr uint64_t kChunkBytes = 64ull << 20;  // pinned memory is allocated 64 MiB at a time
}

HostPool::HostPool(Backend& backend, size_t page_bytes, uint64_t capacity_bytes, bool mapped)
    : backend_(backend), page_(page_bytes), capacity_(capacity_bytes / page_bytes * page_bytes), mapped_(mapped) {}

HostPool::~HostPool() {
  try {
    release_all();
  } catch (...) {
  }
}

bool HostPool::grow() {
  if (held_ + page_ > capacity_) return false;
  if (!mapped_) {
    size_t chunk = std::min<uint64_t>(std::max<uint64_t>(kChunkBytes / page_ * page_, page_), capacity_ - held_);
    void* p = nullptr;
    Status s = backend_.host_alloc_pinned(chunk, &p);
    if (s.code() == VTA_ERR_OUT_OF_MEMORY) return false;
    check(s);
    chunks_.push_back({p, chunk});
    held_ += chunk;
    for (size_t off = chunk; off >= page_; off -= page_)
      free_.push_back(Slot{reinterpret_cast<uintptr_t>(p) + off - page_, 0});
    return true;
  }
  if (!window_) {
    window_bytes_ = capacity_;
    check(backend_.reserve(window_bytes_, page_, &window_));
  }
  PageHandle h = 0;
  Status s = backend_.create_page(page_, PageLocation::host, &h);
  if (s.code() == VTA_ERR_OUT_OF_MEMORY) return false;
  check(s);
  uintptr_t at = window_ + pages_.size() * page_;
  Status m = backend_.map(at, page_, h);
  if (m.is_ok()) m = backend_.set_access(at, page_);
  if (!m.is_ok()) {
    (void)backend_.unmap(at, page_);
    (void)backend_.release_page(h);
    check(m);
  }
  pages_.push_back(Slot{at, h});
  free_.push_back(pages_.back());
  held_ += page_;
  return true;
}

bool HostPool::acquire(Slot* out) {
  if (free_.empty() && !grow()) return false;
  *out = free_.back();
  free_.pop_back();
  ++used_;
  return true;
}

void HostPool::release(const Slot& slot) {
  free_.push_back(slot);
  --used_;
}

void HostPool::release_all() {
  Status first;
  auto keep = [&](const Status& s) {
    if (!s.is_ok() && first.is_ok()) first = s;
  };
  for (auto& [p, n] : chunks_) keep(backend_.host_free_pinned(p, n));
  chunks_.clear();
  for (const Slot& s : pages_) {
    keep(backend_.unmap(s.addr, page_));
    keep(backend_.release_page(s.page));
  }
  pages_.clear();
  if (window_) keep(backend_.free_va(window_, window_bytes_));
  window_ = 0;
  free_.clear();
  held_ = used_ = 0;
  check(first);
}

}  // namespace vta
