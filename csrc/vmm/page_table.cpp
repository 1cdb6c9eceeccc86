// PageTable implementation; see page_table.hpp for the invariants.
#include "vmm/page_table.hpp"

#include <string>

namespace vta {

PageTable::PageTable(Backend& backend, size_t page_bytes, uint64_t capacity_bytes)
    : backend_(backend), page_bytes_(page_bytes), capacity_pages_(capacity_bytes / page_bytes) {}

uintptr_t PageTable::reserve(size_t bytes) {
  VTA_INVARIANT(bytes % page_bytes_ == 0);
  uintptr_t va = 0;
  Status s = backend_.reserve(bytes, page_bytes_, &va);
  if (!s.is_ok()) {
    if (s.code() == VTA_ERR_OUT_OF_MEMORY) fail(VTA_ERR_INVALID_ARGUMENT, "cannot reserve " + std::to_string(bytes) + " bytes of virtual address space: " + s.message());
    check(s);
  }
  reservations_[va] = bytes;
  reserved_bytes_ += bytes;
  return va;
}

bool PageTable::acquire_page(int32_t* id) {
  if (!free_pages_.empty()) {
    *id = free_pages_.back();
    free_pages_.pop_back();
    return true;
  }
  if (pages_held_ >= capacity_pages_) return false;
  PageHandle h = 0;
  Status s = backend_.create_page(page_bytes_, PageLocation::device, &h);
  if (s.code() == VTA_ERR_OUT_OF_MEMORY) return false;
  check(s);
  *id = new_slot(h, 0);
  return true;
}

int32_t PageTable::new_slot(PageHandle handle, uint64_t tag) {
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(pages_.size());
    pages_.emplace_back();
  }
  pages_[slot] = Page{handle, 0, true, tag};
  ++pages_held_;
  return slot;
}

void PageTable::adopt_page(PageHandle handle, uint64_t tag) {
  free_pages_.push_back(new_slot(handle, tag));
  ++capacity_pages_;
}

bool PageTable::holds_tag(uint64_t tag) const {
  for (const Page& p : pages_)
    if (p.held && p.tag == tag) return true;
  return false;
}

std::vector<uint64_t> PageTable::give_back_pages(uint64_t max_pages) {
  std::vector<uint64_t> tags;
  while (!free_pages_.empty() && tags.size() < max_pages) {
    int32_t id = free_pages_.back();
    check(backend_.release_page(pages_[id].handle));
    free_pages_.pop_back();
    tags.push_back(pages_[id].tag);
    pages_[id] = Page{};
    free_slots_.push_back(id);
    --pages_held_;
    --capacity_pages_;
  }
  return tags;
}

void PageTable::return_page(int32_t id) {
  VTA_INVARIANT(pages_[id].held && pages_[id].va == 0);
  free_pages_.push_back(id);
}

namespace {
// Unmaps what a failed map_pages() had mapped (RAII: a failed step leaks nothing).
class MappingRollback {
 public:
  MappingRollback(Backend& backend, uintptr_t va, size_t page_bytes) : backend_(backend), va_(va), page_(page_bytes) {}
  ~MappingRollback() {
    if (committed_ || mapped_ == 0) return;
    (void)backend_.unmap(va_, mapped_ * page_);
  }
  void mapped_one() { ++mapped_; }
  void commit() { committed_ = true; }

 private:
  Backend& backend_;
  uintptr_t va_;
  size_t page_;
  size_t mapped_ = 0;
  bool committed_ = false;
};
}  // namespace

void PageTable::map_pages(uintptr_t va, const std::vector<int32_t>& ids) {
  MappingRollback rollback(backend_, va, page_bytes_);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Page& p = pages_[ids[i]];
    VTA_INVARIANT(p.held && p.va == 0);
    check(backend_.map(va + i * page_bytes_, page_bytes_, p.handle));
    rollback.mapped_one();
  }
  check(backend_.set_access(va, ids.size() * page_bytes_));
  rollback.commit();
  for (size_t i = 0; i < ids.size(); ++i) {
    uintptr_t at = va + i * page_bytes_;
    pages_[ids[i]].va = at;
    mapped_[at] = ids[i];
  }
  pages_mapped_ += ids.size();
  if (pages_mapped_ > peak_pages_mapped_) peak_pages_mapped_ = pages_mapped_;
}

void PageTable::unmap_range(uintptr_t va, size_t bytes) {
  VTA_INVARIANT(bytes % page_bytes_ == 0);
  for (uintptr_t at = va; at < va + bytes; at += page_bytes_) VTA_INVARIANT(mapped_.count(at));
  for (uintptr_t at = va; at < va + bytes; at += page_bytes_) {
    check(backend_.unmap(at, page_bytes_));  // one mapping per call, as cuMemUnmap requires
    auto it = mapped_.find(at);
    pages_[it->second].va = 0;
    free_pages_.push_back(it->second);
    mapped_.erase(it);
    --pages_mapped_;
  }
}

int32_t PageTable::page_at(uintptr_t va) const {
  auto it = mapped_.find(va - va % page_bytes_);
  return it == mapped_.end() ? -1 : it->second;
}

uint64_t PageTable::release_free_pages() {
  uint64_t released = 0;
  while (!free_pages_.empty()) {
    int32_t id = free_pages_.back();
    check(backend_.release_page(pages_[id].handle));
    free_pages_.pop_back();
    pages_[id] = Page{};
    free_slots_.push_back(id);
    --pages_held_;
    released += page_bytes_;
  }
  return released;
}

void PageTable::release_all() {
  // Unmap page by page (mappings are one page each), then release, then free the VA.
  std::vector<uintptr_t> addrs;
  addrs.reserve(mapped_.size());
  for (auto& [va, id] : mapped_) addrs.push_back(va);
  for (uintptr_t va : addrs) unmap_range(va, page_bytes_);
  VTA_INVARIANT(pages_mapped_ == 0);
  release_free_pages();
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    check(backend_.free_va(it->first, it->second));
    reserved_bytes_ -= it->second;
    it = reservations_.erase(it);
  }
}

}  // namespace vta
