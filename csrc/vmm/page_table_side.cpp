// PageTable: windows, host-located handles and side mappings (see page_table.hpp).
//
// Owns: nothing beyond page_table.hpp's: the driver calls that reserve and free a window,
// create and release a host-located handle, and map and unmap a side mapping.
// Invariants: those of page_table.hpp; a side mapping is recorded only once its map and
// set-access calls both succeeded, and forgotten only once its unmap succeeded.
#include <string>

#include "vmm/mapping_rollback.hpp"
#include "vmm/page_table.hpp"

namespace vta {

uintptr_t PageTable::reserve_window(size_t bytes) {
  VTA_INVARIANT(bytes > 0 && bytes % page_bytes_ == 0);
  uintptr_t va = 0;
  check(backend_.reserve(bytes, page_bytes_, &va));
  try {
    windows_.emplace(va, bytes);
  } catch (...) {  // no memory to record it: the reservation goes back at once
    (void)backend_.free_va(va, bytes);
    throw;
  }
  return va;
}

Status PageTable::free_window(uintptr_t va) {
  auto it = windows_.find(va);
  VTA_INVARIANT(it != windows_.end());
  size_t bytes = it->second;
  if (side_overlaps(va, bytes)) return Status::ok();  // release_all() gives both back
  windows_.erase(it);
  return backend_.free_va(va, bytes);
}

Status PageTable::create_host_handle(size_t bytes, PageHandle* out) {
  VTA_INVARIANT(bytes > 0 && bytes % page_bytes_ == 0);
  PageHandle h = 0;
  Status s = backend_.create_page(bytes, PageLocation::host, &h);
  if (!s.is_ok()) return s;
  try {
    host_handles_.insert(h);
  } catch (...) {  // no memory to record it: the handle is released at once
    (void)backend_.release_page(h);
    throw;
  }
  *out = h;
  return s;
}

Status PageTable::release_host_handle(PageHandle handle) {
  auto it = host_handles_.find(handle);
  VTA_INVARIANT(it != host_handles_.end());
  Status s = backend_.release_page(handle);
  if (s.is_ok()) host_handles_.erase(it);
  return s;
}

bool PageTable::side_overlaps(uintptr_t va, uint64_t bytes) const {
  if (side_.empty()) return false;
  auto it = side_.lower_bound(va + bytes);  // the first one starting at or past the end
  if (it == side_.begin()) return false;
  --it;  // the last one starting before the end
  return it->first + it->second > va;
}

Status PageTable::map_side(uintptr_t va, uint64_t bytes, PageHandle handle) {
  // Checked before any driver call, as map_pages does: the driver would not refuse every
  // mistake here (a range past a reservation's end; docs/design.md "Host backend fidelity").
  VTA_INVARIANT(bytes > 0 && va % page_bytes_ == 0 && bytes % page_bytes_ == 0 && !side_overlaps(va, bytes));
  if (!inside(windows_, va, bytes)) {
    VTA_INVARIANT(inside_reservation(va, bytes));
    for (uint64_t off = 0; off < bytes; off += page_bytes_) VTA_INVARIANT(page_at(va + off) < 0);
  }
  MappingRollback rollback(backend_, 1);
  Status s = backend_.map(va, bytes, handle);
  if (!s.is_ok()) return s;
  rollback.mapped_one(va, bytes);
  s = backend_.set_access(va, bytes);
  if (!s.is_ok()) return s;  // the guard unmaps it
  side_.emplace(va, bytes);  // may throw (no memory): the guard unmaps it
  rollback.commit();
  return s;
}

Status PageTable::unmap_side(uintptr_t va, uint64_t bytes) {
  auto it = side_.find(va);
  VTA_INVARIANT(it != side_.end() && it->second == bytes);
  Status s = backend_.unmap(va, bytes);
  if (s.is_ok()) side_.erase(it);
  return s;
}

void PageTable::release_side(Status* first) {
  auto keep = [&](const Status& s) {
    if (!s.is_ok() && first->is_ok()) *first = s;
  };
  for (auto& [va, bytes] : side_) keep(backend_.unmap(va, bytes));
  side_.clear();
  for (PageHandle h : host_handles_) keep(backend_.release_page(h));
  host_handles_.clear();
  for (auto& [va, bytes] : windows_) keep(backend_.free_va(va, bytes));
  windows_.clear();
}

}  // namespace vta
