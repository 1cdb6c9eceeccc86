// Residency transitions: the state machine of away pages (see residency.hpp).
//
// Owns: every step resident -> evicting -> evicted -> restoring [-> restored] -> resident and
// back, the quiesce before a mapping change, and the engine's setup and teardown.
// Invariants: those of residency.hpp; in particular each step records in the AwayPage what
// it did as it succeeds, so a failure part-way can be undone or retried and never loses the
// bytes, and no mapping under live or pending-free data changes before quiesce_pages().
#include <unistd.h>

#include <algorithm>
#include <string>

#include "evict/residency.hpp"

namespace vta {

namespace {

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
}  // namespace

Residency::Residency(const vta_config_t& config, Backend& backend, PageTable& pages, EventPool& events,
                     AllocPolicy& policy)
    : backend_(backend),
      pages_(pages),
      events_(events),
      policy_(policy),
      page_bytes_(pages.page_bytes()),
      capacity_(policy.capacity()) {
  if (config.evict_mode > VTA_EVICT_MAPPED) fail(VTA_ERR_INVALID_ARGUMENT, "unknown evict_mode");
  bool can_map_host = backend_.supports_host_pages();
  if (config.evict_mode == VTA_EVICT_MAPPED && !can_map_host)
    fail(VTA_ERR_BACKEND_UNAVAILABLE,
         "evict_mode=mapped needs host-located VMM pages (CUDA >= 12.2 with HOST_NUMA support)");
  mapped_mode_ = config.evict_mode == VTA_EVICT_MAPPED || (config.evict_mode == VTA_EVICT_AUTO && can_map_host);
  if (mapped_mode_ && config.evict_mode == VTA_EVICT_AUTO) {
    // Probe: the attribute can claim support that creation then refuses (some NUMA nodes).
    PageHandle h = 0;
    Status s = backend_.create_page(page_bytes_, PageLocation::host, &h);
    if (s.is_ok())
      (void)backend_.release_page(h);
    else
      mapped_mode_ = false;
  }
  host_capacity_ = config.host_capacity_bytes ? config.host_capacity_bytes : default_host_capacity(capacity_);
  host_capacity_ = host_capacity_ / page_bytes_ * page_bytes_;
  host_pool_ = std::make_unique<HostPool>(backend_, page_bytes_, host_capacity_, mapped_mode_);
}

StreamHandle Residency::copy_stream() {
  if (!copy_stream_made_) {
    check(backend_.stream_create(&copy_stream_));
    copy_stream_made_ = true;
  }
  return copy_stream_;
}

bool Residency::evict_page(uintptr_t va, bool wait) {
  VTA_INVARIANT(!away_.count(va) && pages_.page_at(va) >= 0);
  HostPool::Slot slot;
  if (!host_pool_->acquire(&slot)) return false;
  StreamHandle cs = 0;
  EventHandle done = 0;
  try {
    cs = copy_stream();
    // Order the copy after the last use: an event on every stream of the page's allocations.
    std::vector<StreamHandle> streams;
    if (!broken(VTA_DEBUG_BREAK_COPY_ORDER)) policy_.live().add_page_streams(va, &streams);
    for (StreamHandle s : streams) events_.record_then_wait(s, cs);
    check(backend_.copy(slot.addr, va, page_bytes_, cs));
    // The copy is queued; if no event records its end, wait for it so the slot is not reused under it.
    done = events_.record_after_copy(cs);
  } catch (...) {
    host_pool_->release(slot);  // the page stays resident, untouched
    throw;
  }
  AwayPage p;
  p.state = State::evicting;
  p.slot = slot;
  p.event = done;
  p.issued = Clock::now();
  away_[va] = p;
  ++in_flight_;
  lru_.remove(va);
  if (policy_.slabs().is_slab(va)) policy_.slabs().stash(va);  // no new small block may land on it
  if (wait) finish_inflight(va, true);
  return true;
}

void Residency::complete_evict(uintptr_t va, AwayPage& p) {
  // The copy completed: the bytes are safe in the host pool. The device page stays mapped
  // at the address (held) until memory is needed: work queued after the offload may still
  // read it, and unmapping it under that work would be an illegal access.
  p.state = State::evicted;
  p.device_held = true;
  --in_flight_;
  counters_.evictions++;
  counters_.bytes_evicted_total += page_bytes_;
  counters_.evict_copy_ns += ns_since(p.issued);
  events_.give(p.event);
  p.event = 0;
  if (broken(VTA_DEBUG_BREAK_QUIESCE)) release_held_page(va, p);  // eager, as if nothing could touch it
}

void Residency::quiesce_pages(const std::vector<uintptr_t>& vas) {
  if (broken(VTA_DEBUG_BREAK_QUIESCE)) return;
  std::vector<StreamHandle> streams;
  for (uintptr_t va : vas) {
    policy_.live().add_page_streams(va, &streams);
    auto it = away_.find(va);
    if (it != away_.end())
      for (StreamHandle s : it->second.consumers) add_stream(&streams, s);
  }
  // A freed block's work may still run until its free completes.
  policy_.pending().add_streams_over(vas, &streams);
  for (StreamHandle s : streams) events_.record_then_sync(s);
}

void Residency::map_host_copy(uintptr_t va, AwayPage& p) {
  Status s = backend_.map(va, page_bytes_, p.slot.page);
  if (s.is_ok()) {
    s = backend_.set_access(va, page_bytes_);
    if (!s.is_ok()) (void)backend_.unmap(va, page_bytes_);
  }
  p.host_mapped = s.is_ok();  // if not, the bytes are still safe in the slot (copy-mode semantics)
}

void Residency::release_held_page(uintptr_t va, AwayPage& p) {
  pages_.unmap_range(va, page_bytes_);
  p.device_held = false;
  if (mapped_mode_) map_host_copy(va, p);  // keep the address valid
}

size_t Residency::release_evicted() {
  auto vas = away_where([](const AwayPage& p) { return p.state == State::evicted && p.device_held; });
  if (vas.empty()) return 0;
  quiesce_pages(vas);
  for (uintptr_t va : vas) release_held_page(va, away_.at(va));
  return vas.size();
}

bool Residency::finish_evictions() {
  auto vas = away_where([](const AwayPage& p) { return p.state == State::evicting; });
  for (uintptr_t va : vas) finish_inflight(va, true);
  return !vas.empty();
}

void Residency::finish_resident(uintptr_t va) {
  away_.erase(va);
  if (policy_.slabs().is_slab(va)) policy_.slabs().unstash(va);
  touch_page(va);
}

void Residency::unevict_held(uintptr_t va) {
  AwayPage& p = away_.at(va);
  VTA_INVARIANT(p.state == State::evicted && p.device_held);
  host_pool_->release(p.slot);  // the device page never stopped holding the bytes
  counters_.restores++;
  finish_resident(va);
}

void Residency::restore_page(uintptr_t va, StreamHandle consumer) {
  if (away_.at(va).state == State::evicting) finish_inflight(va, true);
  AwayPage& q = away_.at(va);
  if (q.state == State::restoring || q.state == State::restored) {
    if (std::find(q.consumers.begin(), q.consumers.end(), consumer) == q.consumers.end()) {
      if (q.state == State::restoring && consumer != copy_stream_) check(backend_.stream_wait_event(consumer, q.event));
      q.consumers.push_back(consumer);
    }
    return;
  }
  if (q.device_held) {
    unevict_held(va);
    return;
  }
  int32_t id = -1;
  if (!policy_.obtain_page(&id, true)) policy_.throw_oom(page_bytes_, "no device page to restore an evicted page into");
  AwayPage& r = away_.at(va);  // obtain may have evicted others: re-find
  StreamHandle cs = 0;
  uintptr_t dst = va;
  bool mapped_at_va = false, mapped_at_window = false;
  try {
    cs = copy_stream();
    if (r.host_mapped) {
      // Mapped mode: fill the device page through its window; the address keeps showing the
      // host copy until the swap (swap_restored_page).
      if (!window_) {
        window_bytes_ = capacity_ / page_bytes_ * page_bytes_;
        check(backend_.reserve(window_bytes_, page_bytes_, &window_));
      }
      dst = window_of(id);
      VTA_INVARIANT(dst + page_bytes_ <= window_ + window_bytes_);
      check(backend_.map(dst, page_bytes_, pages_.handle_of(id)));
      mapped_at_window = true;
      check(backend_.set_access(dst, page_bytes_));
    } else {
      // Copy mode: the address is unmapped, so nothing can be using it: map at once.
      pages_.map_pages(va, {id});
      mapped_at_va = true;
    }
    check(backend_.copy(dst, r.slot.addr, page_bytes_, cs));
    r.event = events_.record_after_copy(cs);
  } catch (...) {
    // Undo: the bytes are still in the host slot; the page goes back to the free pages.
    if (mapped_at_va) {
      (void)backend_.stream_synchronize(cs);
      pages_.unmap_range(va, page_bytes_);
    } else {
      if (mapped_at_window) {
        (void)backend_.stream_synchronize(cs);
        (void)backend_.unmap(dst, page_bytes_);
      }
      pages_.return_page(id);
    }
    throw;
  }
  r.state = State::restoring;
  r.device_page = id;
  r.window_mapped = mapped_at_window;
  r.consumers.assign(1, consumer);
  r.issued = Clock::now();
  ++in_flight_;
  if (consumer != cs) (void)backend_.stream_wait_event(consumer, r.event);  // consumer sees the bytes
}

void Residency::complete_restore(uintptr_t va, AwayPage& p) {
  --in_flight_;
  counters_.restores++;
  counters_.bytes_restored_total += page_bytes_;
  counters_.restore_copy_ns += ns_since(p.issued);
  events_.give(p.event);
  p.event = 0;
  if (p.window_mapped) {
    // Mapped mode: work queued before may still read the host copy at the address; the swap
    // waits for it (swap_restored).
    p.state = State::restored;
    return;
  }
  host_pool_->release(p.slot);
  finish_resident(va);
}

void Residency::swap_restored_page(uintptr_t va, AwayPage& p) {
  VTA_INVARIANT(p.state == State::restored);
  // Each step is recorded in `p` as it succeeds, so a failure can be retried or undone.
  if (p.window_mapped) {
    check(backend_.unmap(window_of(p.device_page), page_bytes_));
    p.window_mapped = false;
  }
  if (p.host_mapped) {
    check(backend_.unmap(va, page_bytes_));
    p.host_mapped = false;
  }
  try {
    pages_.map_pages(va, {p.device_page});  // all or nothing: on failure the page is free (unmapped) again
  } catch (...) {
    // The bytes are still in the host slot: back to evicted, its host page at the address.
    p.state = State::evicted;
    p.device_page = -1;
    p.consumers.clear();
    map_host_copy(va, p);
    throw;
  }
  host_pool_->release(p.slot);
  finish_resident(va);
}

void Residency::swap_restored() {
  auto vas = away_where([](const AwayPage& p) { return p.state == State::restored; });
  if (vas.empty()) return;
  quiesce_pages(vas);
  for (uintptr_t va : vas) swap_restored_page(va, away_.at(va));
}

void Residency::unrestore(AwayPage& p) {
  VTA_INVARIANT(p.state == State::restored);
  if (p.window_mapped) {  // only the copy stream used the window, and its copy completed
    check(backend_.unmap(window_of(p.device_page), page_bytes_));
    p.window_mapped = false;
  }
  pages_.return_page(p.device_page);
  p.device_page = -1;
  p.consumers.clear();
  p.state = State::evicted;
}

void Residency::finish_inflight(uintptr_t va, bool wait) {
  auto it = away_.find(va);
  if (it == away_.end()) return;
  AwayPage& p = it->second;
  if (p.state != State::evicting && p.state != State::restoring) return;
  if (!events_.done(p.event, wait)) return;
  if (p.state == State::evicting)
    complete_evict(va, p);
  else
    complete_restore(va, p);
}

void Residency::drain_inflight(bool wait) {
  if (in_flight_ == 0) return;
  auto vas = away_where(
      [](const AwayPage& p) { return p.state == State::evicting || p.state == State::restoring; });
  for (uintptr_t va : vas) finish_inflight(va, wait);
}

// The page no longer holds live data (its frees completed): forget its evicted copy (see
// ResidencyPort::drop_away_page).
void Residency::drop_away_page(uintptr_t va) {
  finish_inflight(va, true);
  auto it = away_.find(va);
  if (it == away_.end()) return;  // the restore completed: an ordinary resident page now
  AwayPage& p = it->second;
  if (p.state == State::restored) {
    swap_restored_page(va, p);  // nothing live is left on it to wait for
    return;
  }
  if (p.host_mapped) check(backend_.unmap(va, page_bytes_));
  host_pool_->release(p.slot);
  away_.erase(it);
}

void Residency::close() {
  Status first;
  auto keep = [&](const Status& s) {
    if (!s.is_ok() && first.is_ok()) first = s;
  };
  if (copy_stream_made_) keep(backend_.stream_synchronize(copy_stream_));
  for (auto& [va, p] : away_) {
    if ((p.state == State::evicting || p.state == State::restoring) && p.event)
      keep(backend_.event_synchronize(p.event));
    if (p.host_mapped) keep(backend_.unmap(va, page_bytes_));
    if (p.window_mapped) keep(backend_.unmap(window_of(p.device_page), page_bytes_));
    if (p.device_page >= 0 && p.window_mapped) pages_.return_page(p.device_page);
  }
  away_.clear();
  in_flight_ = 0;
  lru_.clear();  // the slabs' stash goes with the policy's state (AllocPolicy::clear)
  if (window_) keep(backend_.free_va(window_, window_bytes_));
  window_ = 0;
  try {
    if (host_pool_) host_pool_->release_all();
  } catch (const Error& e) {
    keep(Status(e.code(), e.what()));
  }
  if (copy_stream_made_) keep(backend_.stream_destroy(copy_stream_));
  copy_stream_made_ = false;
  check(first);
}

}  // namespace vta
