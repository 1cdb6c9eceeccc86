// RestoreWindow: mapped mode's restore window (see restore_window.hpp).
//
// Owns: nothing beyond restore_window.hpp's.
// Invariants: those of restore_window.hpp; a range goes back to the free ranges only once
// nothing is mapped at it.
#include "evict/restore_window.hpp"

namespace vta {

uintptr_t RestoreWindow::take(uint64_t bytes) {
  if (!window_) {
    window_bytes_ = 2 * (capacity_ / page_bytes_ * page_bytes_);  // room for handles of mixed sizes
    check(backend_.reserve(window_bytes_, page_bytes_, &window_));
    free_.insert(window_, window_bytes_);
  }
  uintptr_t at = 0;
  if (!free_.take_best_fit(bytes, &at)) fail(VTA_ERR_OUT_OF_MEMORY, "restore window is full");
  return at;
}

void RestoreWindow::map(uintptr_t at, uint64_t bytes, PageHandle handle, bool* mapped) {
  check(backend_.map(at, bytes, handle));
  *mapped = true;
  check(backend_.set_access(at, bytes));
}

void RestoreWindow::unmap(uintptr_t at, uint64_t bytes) {
  check(backend_.unmap(at, bytes));
  free_.insert(at, bytes);
}

void RestoreWindow::abandon(uintptr_t at, uint64_t bytes, bool mapped) {
  if (mapped) (void)backend_.unmap(at, bytes);
  free_.insert(at, bytes);
}

Status RestoreWindow::close() {
  Status s;
  if (window_) s = backend_.free_va(window_, window_bytes_);
  window_ = 0;
  free_ = RangeSet();
  return s;
}

}  // namespace vta
