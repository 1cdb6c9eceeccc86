// FreeSpace implementation.
//
// Owns: growing the virtual space by one reservation.
// Invariants: those of free_space.hpp.
#include "alloc/free_space.hpp"

#include <algorithm>

namespace vta {

void FreeSpace::grow(uint64_t min_bytes) {
  uint64_t page = pages_.page_bytes();
  uint64_t bytes = std::max<uint64_t>(reservation_bytes_, (min_bytes + page - 1) / page * page);
  uintptr_t va = pages_.reserve(bytes);
  free_.add_fence(va);
  free_.add_fence(va + bytes);
  free_.insert(va, bytes);
}

}  // namespace vta
