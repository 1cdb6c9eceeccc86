// AddressSpace: what PyTorch's full allocator interface needs beyond malloc and free.
//
// Owns: the locking and validation of record_stream, the graph pools' kept blocks, the page
// limit and the lookups by address; the work is the policy's (alloc/alloc_policy.hpp).
// Invariants: those of address_space.hpp; every call takes the space's mutex.
#include <algorithm>

#include "space/address_space.hpp"

namespace vta {

void AddressSpace::record_stream(uintptr_t address, StreamHandle stream) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  check(backend_->check_stream(stream));
  policy_.record_stream(address, stream);
}

void AddressSpace::keep(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.keep(address);
}

bool AddressSpace::unkeep(uintptr_t address, uint64_t requested) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  return policy_.unkeep(address, requested);
}

void AddressSpace::release_kept(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.release_kept(address);
  policy_.drain_pending(false);
}

uint64_t AddressSpace::rounded_size(uint64_t nbytes) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  return policy_.request(nbytes).rounded;
}

bool AddressSpace::holds_address(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return false;
  const auto& r = pages_.reservations();
  auto it = r.upper_bound(address);
  if (it == r.begin()) return false;
  --it;
  return address < it->first + it->second;
}

bool AddressSpace::containing(uintptr_t address, uintptr_t* base, Allocation* out) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  const LiveAllocations::Map& live = policy_.live().all();
  auto it = live.upper_bound(address);
  if (it == live.begin()) return false;
  --it;
  if (it->second.kept || address >= it->first + it->second.size) return false;
  *base = it->first;
  *out = it->second;
  return true;
}

void AddressSpace::set_limit(uint64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  if (leased_) fail(VTA_ERR_INVALID_ARGUMENT, "a leased space's pages are the service's: it takes no limit");
  policy_.set_limit(std::min(bytes, capacity_));
}

uint64_t AddressSpace::limit() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  return policy_.limit();
}

uint64_t AddressSpace::largest_allocatable() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.settle();
  uint64_t mapped = pages_.pages_mapped() * page_bytes_, idle = policy_.cached_bytes() + policy_.pending().bytes();
  uint64_t in_use = mapped > idle ? mapped - idle : 0;
  in_use = std::max(in_use, policy_.live().active_bytes() + policy_.live().kept_bytes());
  uint64_t cap = policy_.limit() / page_bytes_ * page_bytes_;
  uint64_t left = cap > in_use ? cap - in_use : 0;
  return left / page_bytes_ * page_bytes_;
}

std::vector<std::pair<uintptr_t, Allocation>> AddressSpace::records() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  const LiveAllocations::Map& live = policy_.live().all();
  return std::vector<std::pair<uintptr_t, Allocation>>(live.begin(), live.end());
}

}  // namespace vta
