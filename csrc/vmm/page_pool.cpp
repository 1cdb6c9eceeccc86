// PagePool implementation; see page_pool.hpp.
#include "vmm/page_pool.hpp"
#include "vmm/page_geometry.hpp"

#include <unistd.h>

#include <string>

namespace vta {

std::unique_ptr<PagePool> PagePool::create(const vta_config_t& config) {
  PageGeometry g = make_page_geometry(config);
  return std::unique_ptr<PagePool>(new PagePool(std::move(g.backend), g.page_bytes, g.capacity_bytes));
}

PagePool::PagePool(std::unique_ptr<Backend> backend, size_t page_bytes, uint64_t capacity)
    : backend_(std::move(backend)),
      backend_kind_(backend_->kind()),
      device_(backend_->device()),
      page_bytes_(page_bytes),
      capacity_(capacity) {}

PagePool::~PagePool() {
  try {
    close();
  } catch (...) {
  }
}

void PagePool::check_open_locked() const {
  if (closed_) fail(VTA_ERR_CLOSED, "the page pool is closed");
}

uint64_t PagePool::create_page() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  if ((pages_.size() + 1) * page_bytes_ > capacity_)
    throw OutOfMemory("page pool at capacity: " + std::to_string(pages_.size()) + " pages of " +
                          std::to_string(page_bytes_) + " bytes held",
                      page_bytes_, capacity_, pages_.size() * page_bytes_);
  PageHandle h = 0;
  Status s = backend_->create_page(page_bytes_, PageLocation::device, &h);
  if (s.code() == VTA_ERR_OUT_OF_MEMORY)
    throw OutOfMemory("the device has no memory for another page: " + s.message(), page_bytes_, capacity_,
                      pages_.size() * page_bytes_);
  check(s);
  uint64_t id = next_id_++;
  try {
    pages_[id] = h;
  } catch (...) {  // not recorded: not held either (a leaked handle would be held forever)
    (void)backend_->release_page(h);
    throw;
  }
  return id;
}

int PagePool::export_page(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  auto it = pages_.find(id);
  if (it == pages_.end()) fail(VTA_ERR_INVALID_ARGUMENT, "no page " + std::to_string(id) + " in this pool");
  int fd = -1;
  Status s = backend_->export_page(it->second, &fd);
  if (s.code() == VTA_ERR_BACKEND_UNAVAILABLE) exportable_ = false;
  check(s);
  return fd;
}

void PagePool::release_page(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  auto it = pages_.find(id);
  if (it == pages_.end()) fail(VTA_ERR_INVALID_ARGUMENT, "no page " + std::to_string(id) + " in this pool");
  check(backend_->release_page(it->second));
  pages_.erase(it);
}

void PagePool::close() {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return;
  closed_ = true;
  Status first;
  for (auto& [id, h] : pages_) {
    Status s = backend_->release_page(h);
    if (!s.is_ok() && first.is_ok()) first = s;
  }
  pages_.clear();
  backend_.reset();
  check(first);
}

vta_pool_info_t PagePool::info() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  vta_pool_info_t i{};
  i.struct_size = sizeof i;
  i.backend = backend_kind_;
  i.device = device_;
  i.exportable = exportable_ ? 1 : 0;
  i.page_bytes = page_bytes_;
  i.capacity_bytes = capacity_;
  i.pages_held = pages_.size();
  return i;
}

}  // namespace vta
