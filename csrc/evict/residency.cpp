// The eviction engine: AddressSpace's page residency state machine, host pool and LRU.
//
// Owns the transitions resident -> evicting -> evicted -> restoring -> resident of virtual
// pages under live data (see address_space.hpp for the invariants). Every transition that
// fails part-way leaves the bytes where they were: a failed copy or map undoes its own
// steps before the error propagates, and the page keeps its previous state.
#include <unistd.h>

#include <algorithm>
#include <string>

#include "space/address_space.hpp"

namespace vta {

namespace {
void add_stream(std::vector<StreamHandle>* streams, StreamHandle s) {
  if (std::find(streams->begin(), streams->end(), s) == streams->end()) streams->push_back(s);
}

// Default host pool: four times the device capacity, at most half the machine's memory.
// The machine's memory comes from sysconf, never from an iostream: the core must not touch
// the C++ locale machinery (see docs/design.md, "No iostreams in the core").
uint64_t default_host_capacity(uint64_t device_capacity) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  uint64_t limit = pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) / 2 : 0;
  uint64_t want = device_capacity * 4;
  return limit ? std::min(want, limit) : want;
}

uint64_t ns_since(std::chrono::steady_clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t).count());
}
}  // namespace

void AddressSpace::init_eviction(const vta_config_t& config) {
  if (config.evict_mode > VTA_EVICT_MAPPED) fail(VTA_ERR_INVALID_ARGUMENT, "unknown evict_mode");
  bool can_map_host = backend_->supports_host_pages();
  if (config.evict_mode == VTA_EVICT_MAPPED && !can_map_host)
    fail(VTA_ERR_BACKEND_UNAVAILABLE,
         "evict_mode=mapped needs host-located VMM pages (CUDA >= 12.2 with HOST_NUMA support)");
  mapped_mode_ = config.evict_mode == VTA_EVICT_MAPPED || (config.evict_mode == VTA_EVICT_AUTO && can_map_host);
  if (mapped_mode_ && config.evict_mode == VTA_EVICT_AUTO) {
    // Probe: the attribute can claim support that creation then refuses (some NUMA nodes).
    PageHandle h = 0;
    Status s = backend_->create_page(page_bytes_, PageLocation::host, &h);
    if (s.is_ok())
      (void)backend_->release_page(h);
    else
      mapped_mode_ = false;
  }
  host_capacity_ = config.host_capacity_bytes ? config.host_capacity_bytes : default_host_capacity(capacity_);
  host_capacity_ = host_capacity_ / page_bytes_ * page_bytes_;
  host_pool_ = std::make_unique<HostPool>(*backend_, page_bytes_, host_capacity_, mapped_mode_);
}

StreamHandle AddressSpace::copy_stream_locked() {
  if (!copy_stream_made_) {
    check(backend_->stream_create(&copy_stream_));
    copy_stream_made_ = true;
  }
  return copy_stream_;
}

bool AddressSpace::page_evictable_locked(uintptr_t va) {
  bool any = false, all = true;
  for_each_alloc_on_page_locked(va, [&](uintptr_t, const Allocation& a) {
    any = true;
    all = all && a.evictable;
  });
  return any && all;
}

void AddressSpace::lru_remove_locked(uintptr_t va) {
  auto it = lru_pos_.find(va);
  if (it == lru_pos_.end()) return;
  lru_.erase(it->second);
  lru_pos_.erase(it);
}

// Put a resident, evictable page at the most-recently-used end; drop anything else.
void AddressSpace::touch_page_locked(uintptr_t va) {
  lru_remove_locked(va);
  if (away_.count(va) || pages_.page_at(va) < 0 || !page_evictable_locked(va)) return;
  lru_.push_back(va);
  lru_pos_[va] = std::prev(lru_.end());
}

void AddressSpace::touch_range_locked(uintptr_t start, uint64_t bytes) {
  for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_) touch_page_locked(va);
}

void AddressSpace::stash_slab_locked(uintptr_t slab) {
  auto blocks = take_slab_blocks_locked(slab);
  auto& stash = slab_stash_[slab];
  stash.insert(stash.end(), blocks.begin(), blocks.end());
}

void AddressSpace::unstash_slab_locked(uintptr_t slab) {
  auto it = slab_stash_.find(slab);
  if (it == slab_stash_.end()) return;
  for (auto& [a, n] : it->second) small_free_.insert(a, n);
  slab_stash_.erase(it);
}

bool AddressSpace::evict_page_locked(uintptr_t va, bool wait) {
  VTA_INVARIANT(!away_.count(va) && pages_.page_at(va) >= 0);
  HostPool::Slot slot;
  if (!host_pool_->acquire(&slot)) return false;
  StreamHandle cs = 0;
  EventHandle done = 0;
  try {
    cs = copy_stream_locked();
    // Order the copy after the last use: an event on every stream of the page's allocations.
    std::vector<StreamHandle> streams;
    if (!broken(VTA_DEBUG_BREAK_COPY_ORDER)) add_page_streams_locked(va, &streams);
    for (StreamHandle s : streams) {
      EventHandle e = take_event_locked();
      Status st = backend_->event_record(e, s);
      if (st.is_ok()) st = backend_->stream_wait_event(cs, e);
      give_event_locked(e);
      check(st);
    }
    check(backend_->copy(slot.addr, va, page_bytes_, cs));
    done = take_event_locked();
    Status st = backend_->event_record(done, cs);
    if (!st.is_ok()) {
      give_event_locked(done);
      // The copy is queued; wait for it so the slot is not reused under it.
      (void)backend_->stream_synchronize(cs);
      check(st);
    }
  } catch (...) {
    host_pool_->release(slot);  // the page stays resident, untouched
    throw;
  }
  AwayPage p;
  p.state = Residency::evicting;
  p.slot = slot;
  p.event = done;
  p.issued = Clock::now();
  away_[va] = p;
  ++in_flight_;
  lru_remove_locked(va);
  if (slab_used_.count(va)) stash_slab_locked(va);  // no new small block may land on it
  if (wait) finish_inflight_locked(va, true);
  return true;
}

void AddressSpace::complete_evict_locked(uintptr_t va, AwayPage& p) {
  // The copy completed: the bytes are safe in the host pool. The device page stays mapped
  // at the address (held) until memory is needed: work queued after the offload may still
  // read it, and unmapping it under that work would be an illegal access.
  p.state = Residency::evicted;
  p.device_held = true;
  --in_flight_;
  stats_.evictions++;
  stats_.bytes_evicted_total += page_bytes_;
  stats_.evict_copy_ns += ns_since(p.issued);
  give_event_locked(p.event);
  p.event = 0;
  if (broken(VTA_DEBUG_BREAK_QUIESCE)) release_held_page_locked(va, p);  // eager, as if nothing could touch it
}

void AddressSpace::add_page_streams_locked(uintptr_t va, std::vector<StreamHandle>* streams) {
  for_each_alloc_on_page_locked(va, [&](uintptr_t, const Allocation& a) { add_stream(streams, a.stream); });
}

void AddressSpace::quiesce_pages_locked(const std::vector<uintptr_t>& vas) {
  if (broken(VTA_DEBUG_BREAK_QUIESCE)) return;
  std::vector<StreamHandle> streams;
  for (uintptr_t va : vas) {
    add_page_streams_locked(va, &streams);
    auto it = away_.find(va);
    if (it != away_.end())
      for (StreamHandle s : it->second.consumers) add_stream(&streams, s);
  }
  if (pending_count_) {  // a freed block's work may still run until its free completes
    for (auto& [stream, queue] : pending_)
      for (const PendingFree& f : queue)
        for (uintptr_t va : vas)
          if (f.address < va + page_bytes_ && f.address + f.size > va) add_stream(&streams, stream);
  }
  for (StreamHandle s : streams) {
    EventHandle e = take_event_locked();
    Status st = backend_->event_record(e, s);
    if (st.is_ok()) st = backend_->event_synchronize(e);
    give_event_locked(e);
    check(st);
  }
}

void AddressSpace::map_host_copy_locked(uintptr_t va, AwayPage& p) {
  Status s = backend_->map(va, page_bytes_, p.slot.page);
  if (s.is_ok()) {
    s = backend_->set_access(va, page_bytes_);
    if (!s.is_ok()) (void)backend_->unmap(va, page_bytes_);
  }
  p.host_mapped = s.is_ok();  // if not, the bytes are still safe in the slot (copy-mode semantics)
}

void AddressSpace::release_held_page_locked(uintptr_t va, AwayPage& p) {
  pages_.unmap_range(va, page_bytes_);
  p.device_held = false;
  if (mapped_mode_) map_host_copy_locked(va, p);  // keep the address valid
}

size_t AddressSpace::release_evicted_locked() {
  auto vas = away_where_locked([](const AwayPage& p) { return p.state == Residency::evicted && p.device_held; });
  if (vas.empty()) return 0;
  quiesce_pages_locked(vas);
  for (uintptr_t va : vas) release_held_page_locked(va, away_.at(va));
  return vas.size();
}

bool AddressSpace::finish_evictions_locked() {
  auto vas = away_where_locked([](const AwayPage& p) { return p.state == Residency::evicting; });
  for (uintptr_t va : vas) finish_inflight_locked(va, true);
  return !vas.empty();
}

void AddressSpace::finish_resident_locked(uintptr_t va) {
  away_.erase(va);
  if (slab_used_.count(va)) unstash_slab_locked(va);
  touch_page_locked(va);
}

void AddressSpace::unevict_held_locked(uintptr_t va) {
  AwayPage& p = away_.at(va);
  VTA_INVARIANT(p.state == Residency::evicted && p.device_held);
  host_pool_->release(p.slot);  // the device page never stopped holding the bytes
  stats_.restores++;
  finish_resident_locked(va);
}

bool AddressSpace::evict_lru_locked() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    uintptr_t va = *it;
    if (va >= pin_lo_ && va < pin_hi_) continue;  // part of the allocation being made resident
    if (!evict_page_locked(va, true)) return false;  // host pool full
    stats_.pressure_evictions++;
    return true;
  }
  return false;
}

void AddressSpace::restore_page_locked(uintptr_t va, StreamHandle consumer) {
  if (away_.at(va).state == Residency::evicting) finish_inflight_locked(va, true);
  AwayPage& q = away_.at(va);
  if (q.state == Residency::restoring || q.state == Residency::restored) {
    if (std::find(q.consumers.begin(), q.consumers.end(), consumer) == q.consumers.end()) {
      if (q.state == Residency::restoring && consumer != copy_stream_) check(backend_->stream_wait_event(consumer, q.event));
      q.consumers.push_back(consumer);
    }
    return;
  }
  if (q.device_held) {
    unevict_held_locked(va);
    return;
  }
  int32_t id = -1;
  if (!obtain_page_locked(&id)) throw_oom_locked(page_bytes_, "no device page to restore an evicted page into");
  AwayPage& r = away_.at(va);  // obtain may have evicted others: re-find
  StreamHandle cs = 0;
  uintptr_t dst = va;
  bool mapped_at_va = false, mapped_at_window = false;
  try {
    cs = copy_stream_locked();
    if (r.host_mapped) {
      // Mapped mode: fill the device page through its window; the address keeps showing the
      // host copy until the swap (swap_restored_page_locked).
      if (!window_) {
        window_bytes_ = capacity_ / page_bytes_ * page_bytes_;
        check(backend_->reserve(window_bytes_, page_bytes_, &window_));
      }
      dst = window_of(id);
      VTA_INVARIANT(dst + page_bytes_ <= window_ + window_bytes_);
      check(backend_->map(dst, page_bytes_, pages_.handle_of(id)));
      mapped_at_window = true;
      check(backend_->set_access(dst, page_bytes_));
    } else {
      // Copy mode: the address is unmapped, so nothing can be using it: map at once.
      pages_.map_pages(va, {id});
      mapped_at_va = true;
    }
    check(backend_->copy(dst, r.slot.addr, page_bytes_, cs));
    EventHandle done = take_event_locked();
    Status st = backend_->event_record(done, cs);
    if (!st.is_ok()) {
      give_event_locked(done);
      (void)backend_->stream_synchronize(cs);
      check(st);
    }
    r.event = done;
  } catch (...) {
    // Undo: the bytes are still in the host slot; the page goes back to the pool.
    if (mapped_at_va) {
      (void)backend_->stream_synchronize(cs);
      pages_.unmap_range(va, page_bytes_);
    } else {
      if (mapped_at_window) {
        (void)backend_->stream_synchronize(cs);
        (void)backend_->unmap(dst, page_bytes_);
      }
      pages_.return_page(id);
    }
    throw;
  }
  r.state = Residency::restoring;
  r.device_page = id;
  r.window_mapped = mapped_at_window;
  r.consumers.assign(1, consumer);
  r.issued = Clock::now();
  ++in_flight_;
  if (consumer != cs) (void)backend_->stream_wait_event(consumer, r.event);  // consumer sees the bytes
}

void AddressSpace::complete_restore_locked(uintptr_t va, AwayPage& p) {
  --in_flight_;
  stats_.restores++;
  stats_.bytes_restored_total += page_bytes_;
  stats_.restore_copy_ns += ns_since(p.issued);
  give_event_locked(p.event);
  p.event = 0;
  if (p.window_mapped) {
    // Mapped mode: work queued before may still read the host copy at the address; the swap
    // waits for it (swap_restored_locked).
    p.state = Residency::restored;
    return;
  }
  host_pool_->release(p.slot);
  finish_resident_locked(va);
}

void AddressSpace::swap_restored_page_locked(uintptr_t va, AwayPage& p) {
  VTA_INVARIANT(p.state == Residency::restored);
  // Each step is recorded in `p` as it succeeds, so a failure can be retried or undone.
  if (p.window_mapped) {
    check(backend_->unmap(window_of(p.device_page), page_bytes_));
    p.window_mapped = false;
  }
  if (p.host_mapped) {
    check(backend_->unmap(va, page_bytes_));
    p.host_mapped = false;
  }
  try {
    pages_.map_pages(va, {p.device_page});  // all or nothing: on failure the page is back in the pool
  } catch (...) {
    // The bytes are still in the host slot: back to evicted, its host page at the address.
    p.state = Residency::evicted;
    p.device_page = -1;
    p.consumers.clear();
    map_host_copy_locked(va, p);
    throw;
  }
  host_pool_->release(p.slot);
  finish_resident_locked(va);
}

void AddressSpace::swap_restored_locked() {
  auto vas = away_where_locked([](const AwayPage& p) { return p.state == Residency::restored; });
  if (vas.empty()) return;
  quiesce_pages_locked(vas);
  for (uintptr_t va : vas) swap_restored_page_locked(va, away_.at(va));
}

void AddressSpace::unrestore_locked(AwayPage& p) {
  VTA_INVARIANT(p.state == Residency::restored);
  if (p.window_mapped) {  // only the copy stream used the window, and its copy completed
    check(backend_->unmap(window_of(p.device_page), page_bytes_));
    p.window_mapped = false;
  }
  pages_.return_page(p.device_page);
  p.device_page = -1;
  p.consumers.clear();
  p.state = Residency::evicted;
}

void AddressSpace::finish_inflight_locked(uintptr_t va, bool wait) {
  auto it = away_.find(va);
  if (it == away_.end()) return;
  AwayPage& p = it->second;
  if (p.state != Residency::evicting && p.state != Residency::restoring) return;
  if (!event_done_locked(p.event, wait)) return;
  if (p.state == Residency::evicting)
    complete_evict_locked(va, p);
  else
    complete_restore_locked(va, p);
}

void AddressSpace::drain_inflight_locked(bool wait) {
  if (in_flight_ == 0) return;
  auto vas = away_where_locked(
      [](const AwayPage& p) { return p.state == Residency::evicting || p.state == Residency::restoring; });
  for (uintptr_t va : vas) finish_inflight_locked(va, wait);
}

// The page no longer holds live data (its frees completed): forget its evicted copy. A
// device page still mapped there stays (the caller caches it); otherwise the address ends
// up unmapped.
void AddressSpace::drop_away_page_locked(uintptr_t va) {
  finish_inflight_locked(va, true);
  auto it = away_.find(va);
  if (it == away_.end()) return;  // the restore completed: an ordinary resident page now
  AwayPage& p = it->second;
  if (p.state == Residency::restored) {
    swap_restored_page_locked(va, p);  // nothing live is left on it to wait for
    return;
  }
  if (p.host_mapped) check(backend_->unmap(va, page_bytes_));
  host_pool_->release(p.slot);
  away_.erase(it);
}

void AddressSpace::prefetch_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer) {
  pin_lo_ = page_of(start);
  pin_hi_ = start + bytes;
  try {
    // Pages whose device page was never released come back first, for free: restoring the
    // others may need memory, and must not release these to get it.
    for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_) {
      auto it = away_.find(va);
      if (it != away_.end() && it->second.state == Residency::evicted && it->second.device_held) unevict_held_locked(va);
    }
    for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_)
      if (away_.count(va)) restore_page_locked(va, consumer);
  } catch (...) {
    pin_lo_ = pin_hi_ = 0;
    throw;
  }
  pin_lo_ = pin_hi_ = 0;
}

void AddressSpace::ensure_resident_locked(uintptr_t start, uint64_t bytes, StreamHandle consumer) {
  prefetch_locked(start, bytes, consumer);
  auto t0 = Clock::now();
  bool waited = false, swap = false;
  for (uintptr_t va = page_of(start); va < start + bytes; va += page_bytes_) {
    if (!away_.count(va)) continue;
    waited = true;
    finish_inflight_locked(va, true);
    auto it = away_.find(va);
    swap = swap || (it != away_.end() && it->second.state == Residency::restored);
  }
  if (swap) swap_restored_locked();  // one wait for every restored page, these included
  if (waited) stats_.restore_wait_ns += ns_since(t0);
  touch_range_locked(start, bytes);
}

void AddressSpace::release_eviction_locked() {
  Status first;
  auto keep = [&](const Status& s) {
    if (!s.is_ok() && first.is_ok()) first = s;
  };
  if (copy_stream_made_) keep(backend_->stream_synchronize(copy_stream_));
  for (auto& [va, p] : away_) {
    if ((p.state == Residency::evicting || p.state == Residency::restoring) && p.event)
      keep(backend_->event_synchronize(p.event));
    if (p.host_mapped) keep(backend_->unmap(va, page_bytes_));
    if (p.window_mapped) keep(backend_->unmap(window_of(p.device_page), page_bytes_));
    if (p.device_page >= 0 && p.window_mapped) pages_.return_page(p.device_page);
  }
  away_.clear();
  in_flight_ = 0;
  lru_.clear();
  lru_pos_.clear();
  slab_stash_.clear();
  if (window_) keep(backend_->free_va(window_, window_bytes_));
  window_ = 0;
  try {
    if (host_pool_) host_pool_->release_all();
  } catch (const Error& e) {
    keep(Status(e.code(), e.what()));
  }
  if (copy_stream_made_) keep(backend_->stream_destroy(copy_stream_));
  copy_stream_made_ = false;
  check(first);
}

// ---- public entry points ---------------------------------------------------------------

void AddressSpace::set_evictable(uintptr_t address, bool evictable) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_inflight_locked(false);
  auto it = find_live_locked(address);
  Allocation& a = it->second;
  if (!evictable) ensure_resident_locked(it->first, a.size, a.stream);
  if (a.evictable != evictable) {
    if (evictable)
      evictable_bytes_ += a.size;
    else
      evictable_bytes_ -= a.size;
    a.evictable = evictable;
  }
  touch_range_locked(it->first, a.size);
}

void AddressSpace::offload(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_inflight_locked(false);
  auto it = find_live_locked(address);
  uintptr_t start = it->first;
  uint64_t size = it->second.size;
  // All or nothing on sharing: a page shared with an allocation not marked evictable stays.
  for (uintptr_t va = page_of(start); va < start + size; va += page_bytes_) {
    bool shared_pinned = false;
    for_each_alloc_on_page_locked(va, [&](uintptr_t at, const Allocation& other) {
      if (at != start && !other.evictable) shared_pinned = true;
    });
    if (shared_pinned)
      fail(VTA_ERR_INVALID_ARGUMENT, "cannot offload: a page of this allocation is shared with an allocation "
                                     "not marked evictable (mark both with set_evictable)");
  }
  for (uintptr_t va = page_of(start); va < start + size; va += page_bytes_) {
    auto away = away_.find(va);
    if (away != away_.end()) {
      if (away->second.state == Residency::restoring) finish_inflight_locked(va, true);
      away = away_.find(va);
      if (away != away_.end() && away->second.state == Residency::restored) unrestore_locked(away->second);
      if (away_.count(va)) continue;  // evicting or evicted
    }
    if (!evict_page_locked(va, false))
      fail(VTA_ERR_HOST_POOL_EXHAUSTED, "host pool exhausted: " + std::to_string(host_pool_->used_bytes()) +
                                            " of " + std::to_string(host_pool_->capacity_bytes()) +
                                            " bytes hold evicted pages (raise host_capacity)");
  }
}

void AddressSpace::prefetch(uintptr_t address, const StreamHandle* stream) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_inflight_locked(false);
  auto it = find_live_locked(address);
  prefetch_locked(it->first, it->second.size, stream ? *stream : it->second.stream);
}

void AddressSpace::ensure_resident(uintptr_t address, const StreamHandle* stream) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_inflight_locked(false);
  auto it = find_live_locked(address);
  ensure_resident_locked(it->first, it->second.size, stream ? *stream : it->second.stream);
}

int AddressSpace::residency(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_inflight_locked(false);
  auto it = find_live_locked(address);
  bool evicted = false;
  for (uintptr_t va = page_of(it->first); va < it->first + it->second.size; va += page_bytes_) {
    auto p = away_.find(va);
    if (p == away_.end()) continue;
    if (p->second.state != Residency::evicted) return VTA_IN_FLIGHT;
    evicted = true;
  }
  return evicted ? VTA_EVICTED : VTA_RESIDENT;
}

void AddressSpace::inject_fault(int op, int times) {
  if (op < 0 || op >= static_cast<int>(FaultOp::count) || times < 0)
    fail(VTA_ERR_INVALID_ARGUMENT, "inject_fault: unknown operation or negative count");
  backend_->inject(static_cast<FaultOp>(op), times);
}

void AddressSpace::break_ordering(uint32_t mask) {
  constexpr uint32_t known = VTA_DEBUG_BREAK_QUIESCE | VTA_DEBUG_BREAK_COPY_ORDER | VTA_DEBUG_BREAK_FREE_WAIT;
  if (mask & ~known) fail(VTA_ERR_INVALID_ARGUMENT, "break_ordering: unknown bits");
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  debug_break_ = mask;
}

}  // namespace vta
