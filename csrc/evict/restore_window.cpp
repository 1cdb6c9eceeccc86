// RestoreWindow: mapped mode's restore window (see restore_window.hpp).
//
// Owns: nothing beyond restore_window.hpp's.
// Invariants: those of restore_window.hpp; a range goes back to the free ranges only once
// nothing is mapped at it.
#include "evict/restore_window.hpp"

namespace vta {

uintptr_t RestoreWindow::take(uint64_t bytes) {
  if (!window_) {
    size_t page_bytes = pages_.page_bytes();
    window_bytes_ = 2 * (capacity_ / page_bytes * page_bytes);  // room for handles of mixed sizes
    window_ = pages_.reserve_window(window_bytes_);
    free_.insert(window_, window_bytes_);
  }
  uintptr_t at = 0;
  if (!free_.take_best_fit(bytes, &at)) fail(VTA_ERR_OUT_OF_MEMORY, "restore window is full");
  return at;
}

void RestoreWindow::map(uintptr_t at, uint64_t bytes, PageHandle handle) { check(pages_.map_side(at, bytes, handle)); }

void RestoreWindow::unmap(uintptr_t at, uint64_t bytes) {
  check(pages_.unmap_side(at, bytes));
  free_.insert(at, bytes);
}

void RestoreWindow::abandon(uintptr_t at, uint64_t bytes, bool mapped) {
  if (mapped && !pages_.unmap_side(at, bytes).is_ok()) return;  // still mapped: the range stays taken
  free_.insert(at, bytes);
}

Status RestoreWindow::close() {
  Status s;
  if (window_) s = pages_.free_window(window_);
  window_ = 0;
  free_ = RangeSet();
  return s;
}

}  // namespace vta
