// AddressSpace entry points of eviction: each takes the lock, finds the live allocation and
// hands its pages to the engine (csrc/evict/residency.hpp has the states and the ordering).
//
// Owns: nothing of its own; the argument checks of these entry points (a stream given is
// one the backend knows).
// Invariants: every entry point first completes the copies that finished
// (drain_inflight(false)), so states read below are current.
#include "space/address_space.hpp"

namespace vta {

LiveAllocations::Map::iterator AddressSpace::settled_live_locked(uintptr_t address) {
  check_open_locked();
  residency_.drain_inflight(false);
  return policy_.live().find_live(address);
}

void AddressSpace::restore_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer, bool count_oom) {
  residency_.begin_restore(start, bytes);
  uintptr_t cursor = start, first = 0;
  uint32_t npages = 0;
  while (residency_.next_to_restore(&cursor, start + bytes, consumer, &first, &npages)) {
    int32_t id = -1;
    // "Need a page": the policy's sources, then the engine's (free_device_page takes nothing
    // from the allocation), then the policy's again; neither calls the other.
    // Last, the extents blocks use only in part are split (their untouched pages released).
    for (AllocPolicy::Take t; (t = policy_.take_handle(npages, &id)) != AllocPolicy::Take::taken;)
      if (t == AllocPolicy::Take::refused ||
          (!residency_.free_device_page(true, start, start + bytes) &&
           !policy_.split_extents_for_pages(npages, consumer)))
        policy_.throw_oom(uint64_t{npages} * page_bytes_, "no device memory to restore an evicted page into",
                          count_oom);
    residency_.restore_page(first, id, consumer);
  }
}

void AddressSpace::ensure_resident_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer, bool count_oom) {
  restore_locked(start, bytes, consumer, count_oom);
  residency_.finish_restore(start, bytes);
}

void AddressSpace::set_evictable(uintptr_t address, bool evictable) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = settled_live_locked(address);
  const Allocation& a = it->second;
  check_not_paused_locked(it->first, a.size, "set_evictable");
  if (!evictable) ensure_resident_locked(it->first, a.size, a.stream);
  policy_.live().set_evictable(it, evictable);
  residency_.note_use(it->first, a.size);
}

uint64_t AddressSpace::offload(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = settled_live_locked(address);
  check_not_paused_locked(it->first, it->second.size, "offload");
  return residency_.offload(it->first, it->second.size);
}

void AddressSpace::prefetch(uintptr_t address, const StreamHandle* stream, bool count_oom) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = settled_live_locked(address);
  if (stream) check(backend_->check_stream(*stream));
  check_not_paused_locked(it->first, it->second.size, "prefetch");
  restore_locked(it->first, it->second.size, stream ? *stream : it->second.stream, count_oom);
}

void AddressSpace::ensure_resident(uintptr_t address, const StreamHandle* stream, bool count_oom) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = settled_live_locked(address);
  if (stream) check(backend_->check_stream(*stream));
  check_not_paused_locked(it->first, it->second.size, "ensure_resident");
  ensure_resident_locked(it->first, it->second.size, stream ? *stream : it->second.stream, count_oom);
}

int AddressSpace::residency(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = settled_live_locked(address);
  return residency_.residency_of(it->first, it->second.size);
}

}  // namespace vta
