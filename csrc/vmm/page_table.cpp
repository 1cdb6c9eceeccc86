// PageTable implementation; see page_table.hpp for the invariants.
#include "vmm/page_table.hpp"

#include <algorithm>
#include <string>

#include "vmm/mapping_rollback.hpp"

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
    --free_page_count_;
    return true;
  }
  if (pages_held_ >= capacity_pages_) return false;
  PageHandle h = 0;
  Status s = backend_.create_page(page_bytes_, PageLocation::device, &h);
  if (s.code() == VTA_ERR_OUT_OF_MEMORY) {
    driver_refusal_ = s.message();
    return false;
  }
  check(s);
  *id = new_slot_or_release(h, 0, 1);
  driver_refusal_.clear();  // the driver gave a page: an earlier refusal no longer explains an OOM
  return true;
}

bool PageTable::acquire_extent(uint32_t npages, int32_t* id, bool* driver_oom) {
  VTA_INVARIANT(npages > 1);
  *driver_oom = false;
  auto same = std::find_if(free_extents_.begin(), free_extents_.end(),
                           [&](int32_t e) { return pages_[e].npages == npages; });
  if (same != free_extents_.end()) {
    *id = *same;
    free_extents_.erase(same);
    free_page_count_ -= npages;
    return true;
  }
  if (pages_held_ + npages > capacity_pages_) return false;
  PageHandle h = 0;
  Status s = backend_.create_page(uint64_t{npages} * page_bytes_, PageLocation::device, &h);
  if (s.code() == VTA_ERR_OUT_OF_MEMORY) {
    driver_refusal_ = s.message();
    *driver_oom = true;
    return false;
  }
  check(s);
  *id = new_slot_or_release(h, 0, npages);
  driver_refusal_.clear();
  return true;
}

int32_t PageTable::new_slot(PageHandle handle, uint64_t tag, uint32_t npages) {
  // What may throw (no memory) comes before any change: a refusal leaves the books as they were.
  if (npages > 1) extent_ids_.reserve(extent_ids_.size() + 1);
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<int32_t>(pages_.size());
    pages_.emplace_back();
  }
  pages_[slot] = Page{handle, 0, true, npages, tag};
  pages_held_ += npages;
  pages_adopted_total_ += npages;
  if (pages_held_ > peak_pages_held_) peak_pages_held_ = pages_held_;
  if (npages > 1) {
    ++extents_held_;
    extent_ids_.push_back(slot);
  }
  return slot;
}

int32_t PageTable::new_slot_or_release(PageHandle handle, uint64_t tag, uint32_t npages) {
  try {
    return new_slot(handle, tag, npages);
  } catch (...) {  // no slot (no memory): the handle is in no book, so it goes back at once
    (void)backend_.release_page(handle);
    throw;
  }
}

std::string PageTable::take_driver_refusal() {
  std::string r;
  r.swap(driver_refusal_);
  return r;
}

void PageTable::push_free(int32_t id) {
  (pages_[id].npages == 1 ? free_pages_ : free_extents_).push_back(id);
  free_page_count_ += pages_[id].npages;
}

void PageTable::release_slot(int32_t id) {
  Page& p = pages_[id];
  check(backend_.release_page(p.handle));
  pages_held_ -= p.npages;
  pages_released_total_ += p.npages;
  free_page_count_ -= p.npages;
  if (p.npages > 1) {
    --extents_held_;
    extent_ids_.erase(std::find(extent_ids_.begin(), extent_ids_.end(), id));
  }
  p = Page{};
  free_slots_.push_back(id);
}

void PageTable::adopt_page(PageHandle handle, uint64_t tag) {
  try {
    free_pages_.reserve(free_pages_.size() + 1);  // push_free below cannot throw then
  } catch (...) {
    (void)backend_.release_page(handle);
    throw;
  }
  push_free(new_slot_or_release(handle, tag, 1));
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
    uint64_t tag = pages_[id].tag;
    release_slot(id);  // throws with the page still listed free: nothing lost
    free_pages_.pop_back();
    tags.push_back(tag);
    --capacity_pages_;
  }
  return tags;
}

void PageTable::return_page(int32_t id) {
  VTA_INVARIANT(pages_[id].held && pages_[id].va == 0);
  push_free(id);
}

void PageTable::release_free(int32_t id) {
  std::vector<int32_t>& list = pages_[id].npages == 1 ? free_pages_ : free_extents_;
  auto it = std::find(list.begin(), list.end(), id);
  VTA_INVARIANT(pages_[id].held && pages_[id].va == 0 && it != list.end());
  list.erase(it);
  release_slot(id);
}

bool PageTable::release_one_free(bool extents) {
  std::vector<int32_t>& list = extents ? free_extents_ : free_pages_;
  if (list.empty()) return false;
  release_slot(list.back());
  list.pop_back();
  return true;
}

bool PageTable::release_free_for(uint64_t npages, bool pages_first) {
  bool any = false;
  while (pages_held_ + npages > capacity_pages_) {
    if (!release_one_free(!pages_first) && !release_one_free(pages_first)) break;
    any = true;
  }
  return any;
}

bool PageTable::inside(const std::map<uintptr_t, size_t>& ranges, uintptr_t va, uint64_t bytes) {
  auto it = ranges.upper_bound(va);
  if (it == ranges.begin()) return false;
  --it;
  return va >= it->first && bytes <= it->second && va - it->first <= it->second - bytes;
}

bool PageTable::inside_reservation(uintptr_t va, uint64_t bytes) const { return inside(reservations_, va, bytes); }

void PageTable::map_pages(uintptr_t va, const std::vector<int32_t>& ids) {
  // The range lies in one reservation of ours, checked here: the CUDA driver accepts a map
  // that runs past a reservation's end (observed, docs/design.md "Host backend fidelity"), so
  // only the host backend would otherwise catch a range computed wrong. Before any driver call:
  // the error leaves nothing mapped.
  uint64_t total = 0;
  for (int32_t id : ids) total += bytes_of(id);
  VTA_INVARIANT(inside_reservation(va, total) && !side_overlaps(va, total));
  MappingRollback rollback(backend_, ids.size());
  uintptr_t at = va;
  for (int32_t id : ids) {
    const Page& p = pages_[id];
    VTA_INVARIANT(p.held && p.va == 0);
    check(backend_.map(at, bytes_of(id), p.handle));  // a handle is mapped whole
    rollback.mapped_one(at, bytes_of(id));
    at += bytes_of(id);
  }
  check(backend_.set_access(va, at - va));
  rollback.commit();
  at = va;
  for (int32_t id : ids) {
    pages_[id].va = at;
    for (uint32_t k = 0; k < pages_[id].npages; ++k) mapped_[at + k * page_bytes_] = id;
    if (pages_[id].npages > 1) mapped_extents_.emplace(at, id);
    pages_mapped_ += pages_[id].npages;
    at += bytes_of(id);
  }
  if (pages_mapped_ > peak_pages_mapped_) peak_pages_mapped_ = pages_mapped_;
}

void PageTable::unmap_range(uintptr_t va, size_t bytes) {
  VTA_INVARIANT(bytes % page_bytes_ == 0);
  // Whole handles only: the range starts where a handle starts and ends where one ends.
  for (uintptr_t at = va; at < va + bytes;) {
    auto it = mapped_.find(at);
    VTA_INVARIANT(it != mapped_.end() && pages_[it->second].va == at && at + bytes_of(it->second) <= va + bytes);
    at += bytes_of(it->second);
  }
  for (uintptr_t at = va; at < va + bytes;) {
    int32_t id = mapped_.at(at);
    at += bytes_of(id);
    unmap_taken(id);  // one handle per call, as cuMemUnmap requires
    push_free(id);
  }
}

void PageTable::map_alias(uintptr_t alias, int32_t id) {
  const Page& p = pages_[id];
  VTA_INVARIANT(p.held && p.va != 0 && alias % page_bytes_ == 0 && inside_reservation(alias, bytes_of(id)) &&
                !side_overlaps(alias, bytes_of(id)));
  for (uint32_t k = 0; k < p.npages; ++k) VTA_INVARIANT(!mapped_.count(alias + k * page_bytes_));
  check(backend_.map(alias, bytes_of(id), p.handle));
  Status s = backend_.set_access(alias, bytes_of(id));
  if (!s.is_ok()) (void)backend_.unmap(alias, bytes_of(id));
  check(s);
}

void PageTable::unmap_alias(uintptr_t alias, int32_t id) {
  check(backend_.unmap(alias, bytes_of(id)));
}

void PageTable::unmap_taken(int32_t id) {
  uintptr_t va = pages_[id].va;
  VTA_INVARIANT(pages_[id].held && va != 0);
  check(backend_.unmap(va, bytes_of(id)));
  for (uint32_t k = 0; k < pages_[id].npages; ++k) mapped_.erase(va + k * page_bytes_);
  if (pages_[id].npages > 1) mapped_extents_.erase(va);
  pages_[id].va = 0;
  pages_mapped_ -= pages_[id].npages;
}

void PageTable::release_taken(int32_t id) {
  VTA_INVARIANT(pages_[id].held && pages_[id].va == 0);
  uint32_t n = pages_[id].npages;
  free_page_count_ += n;  // release_slot counts a free handle out
  try {
    release_slot(id);
  } catch (...) {
    free_page_count_ -= n;  // refused before anything changed: still taken
    throw;
  }
}

int32_t PageTable::page_at(uintptr_t va) const {
  auto it = mapped_.find(va - va % page_bytes_);
  return it == mapped_.end() ? -1 : it->second;
}

bool PageTable::handle_boundary(uintptr_t va) const {
  int32_t id = page_at(va);
  return id < 0 || pages_[id].va == va;
}

uint64_t PageTable::release_free_pages() {
  uint64_t released = 0;
  for (bool extents : {false, true}) {
    std::vector<int32_t>& list = extents ? free_extents_ : free_pages_;
    while (!list.empty()) {
      released += bytes_of(list.back());
      release_one_free(extents);
    }
  }
  return released;
}

void PageTable::release_all() {
  // What evict/ left (its close gives back its own first; a refused call leaves some): side
  // mappings, host-located handles and windows. Their error is reported after the rest went.
  Status side;
  release_side(&side);
  // Unmap handle by handle, then release, then free the VA.
  std::vector<uintptr_t> addrs;
  for (const Page& p : pages_)
    if (p.held && p.va) addrs.push_back(p.va);
  for (uintptr_t va : addrs) unmap_range(va, bytes_of(mapped_.at(va)));
  VTA_INVARIANT(pages_mapped_ == 0);
  release_free_pages();
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    check(backend_.free_va(it->first, it->second));
    reserved_bytes_ -= it->second;
    it = reservations_.erase(it);
  }
  check(side);
}

}  // namespace vta
