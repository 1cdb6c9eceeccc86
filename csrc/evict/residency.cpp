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
                     const PageUsers& users, uint64_t capacity)
    : backend_(backend),
      pages_(pages),
      events_(events),
      users_(users),
      page_bytes_(pages.page_bytes()),
      capacity_(capacity) {
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

void Residency::copy_slots(uintptr_t va, const HostPool::Slots& slots, bool to_host, StreamHandle stream) {
  uintptr_t at = va;
  for (const HostPool::Slot& s : slots) {
    uint64_t n = uint64_t{s.npages} * page_bytes_;
    check(to_host ? backend_.copy(s.addr, at, n, stream) : backend_.copy(at, s.addr, n, stream));
    at += n;
  }
}

const Residency::AwayPage* Residency::away_at(uintptr_t va, uintptr_t* first) const {
  uintptr_t f = away_first(va);
  if (!f) return nullptr;
  if (first) *first = f;
  return &away_.at(f);
}

bool Residency::away_span(uintptr_t va, uintptr_t* first, uint64_t* bytes) const {
  uintptr_t f = away_first(va);
  if (!f) return false;
  *first = f;
  *bytes = bytes_of(away_.at(f));
  return true;
}

uintptr_t Residency::away_first(uintptr_t va) const {
  uintptr_t page = page_of(va);
  if (away_.count(page)) return page;
  auto it = away_first_.find(page);
  return it == away_first_.end() ? 0 : it->second;
}

Residency::AwayPage& Residency::add_away(uintptr_t va, const AwayPage& p) {
  for (uint32_t k = 1; k < p.npages; ++k) away_first_[va + k * page_bytes_] = va;
  return away_[va] = p;
}

void Residency::erase_away(uintptr_t va) {
  auto it = away_.find(va);
  for (uint32_t k = 1; k < it->second.npages; ++k) away_first_.erase(va + k * page_bytes_);
  away_.erase(it);
}

bool Residency::evict_page(uintptr_t page, bool wait) {
  // The whole handle under the page moves: one copy, and later one unmap.
  int32_t id = pages_.page_at(page);
  VTA_INVARIANT(!away_first(page) && id >= 0);
  uintptr_t va = pages_.address_of(id);
  uint32_t npages = pages_.pages_of(id);
  uint64_t bytes = pages_.bytes_of(id);
  HostPool::Slots slots;
  if (!host_pool_->acquire(npages, &slots)) return false;
  StreamHandle cs = 0;
  EventHandle done = 0;
  try {
    cs = copy_stream();
    // Order the copy after the last use: an event on every stream of the handle's allocations
    // (their own and those recorded on them with record_stream).
    std::vector<StreamHandle> streams;
    if (!broken(VTA_DEBUG_BREAK_COPY_ORDER)) users_.add_live_streams(va, bytes, &streams);
    for (StreamHandle s : streams) events_.record_then_wait(s, cs);
    copy_slots(va, slots, /*to_host=*/true, cs);
    // The copy is queued; if no event records its end, wait for it so the slot is not reused under it.
    done = events_.record_after_copy(cs);
  } catch (...) {
    host_pool_->release(slots);  // the handle stays resident, untouched
    throw;
  }
  AwayPage p;
  p.state = State::evicting;
  p.npages = npages;
  p.slots = std::move(slots);
  p.event = done;
  p.issued = Clock::now();
  add_away(va, p);
  in_flight_ += npages;
  victims_->forget_range(va, va + uint64_t{npages} * page_bytes_);
  if (wait) finish_inflight(va, true);
  return true;
}

void Residency::complete_evict(uintptr_t va, AwayPage& p) {
  // The copy completed: the bytes are safe in the host pool. The device handle stays mapped
  // at the address (held) until memory is needed: work queued after the offload may still
  // read it, and unmapping it under that work would be an illegal access.
  p.state = State::evicted;
  p.device_held = true;
  in_flight_ -= p.npages;
  counters_.evictions += p.npages;
  counters_.bytes_evicted_total += bytes_of(p);
  counters_.evict_copy_ns += ns_since(p.issued);
  events_.give(p.event);
  p.event = 0;
  if (broken(VTA_DEBUG_BREAK_QUIESCE)) release_held_page(va, p);  // eager, as if nothing could touch it
}

void Residency::quiesce_pages(const std::vector<uintptr_t>& vas) {
  if (broken(VTA_DEBUG_BREAK_QUIESCE)) return;
  std::vector<StreamHandle> streams;
  std::vector<uintptr_t> pages;  // every virtual page of these away pages
  for (uintptr_t va : vas) {
    auto it = away_.find(va);
    uint32_t npages = it != away_.end() ? it->second.npages : 1;
    for (uint32_t k = 0; k < npages; ++k) pages.push_back(va + k * page_bytes_);
    users_.add_live_streams(va, uint64_t{npages} * page_bytes_, &streams);
    if (it != away_.end())
      for (StreamHandle s : it->second.consumers) add_stream(&streams, s);
  }
  // A freed block's work may still run until its free completes (pending, or after record_stream).
  users_.add_freed_streams(pages, &streams);
  for (StreamHandle s : streams) events_.record_then_sync(s);
}

void Residency::map_host_copy(uintptr_t va, AwayPage& p) {
  VTA_INVARIANT(p.slots.size() == 1);  // mapped mode: one host-located handle
  Status s = backend_.map(va, bytes_of(p), p.slots[0].page);
  if (s.is_ok()) {
    s = backend_.set_access(va, bytes_of(p));
    if (!s.is_ok()) (void)backend_.unmap(va, bytes_of(p));
  }
  p.host_mapped = s.is_ok();  // if not, the bytes are still safe in the slot (copy-mode semantics)
}

void Residency::release_held_page(uintptr_t va, AwayPage& p) {
  pages_.unmap_range(va, bytes_of(p));  // the whole handle: one call
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
  uint32_t npages = away_.at(va).npages;
  erase_away(va);
  for (uint32_t k = 0; k < npages; ++k) note_page(va + k * page_bytes_);
}

void Residency::unevict_held(uintptr_t va) {
  AwayPage& p = away_.at(va);
  VTA_INVARIANT(p.state == State::evicted && p.device_held);
  host_pool_->release(p.slots);  // the device handle never stopped holding the bytes
  counters_.restores += p.npages;
  finish_resident(va);
}

void Residency::begin_restore(uintptr_t start, uint64_t bytes) {
  pin(start, start + bytes);
  // Pages whose device page was never released come back first, for free: restoring the
  // others may need memory, and must not release these to get it.
  for (uintptr_t va = page_of(start); va < start + bytes;) {
    uintptr_t first = 0;
    const AwayPage* p = away_at(va, &first);
    if (!p) {
      va += page_bytes_;
      continue;
    }
    uintptr_t next = first + bytes_of(*p);
    if (p->state == State::evicted && p->device_held) unevict_held(first);  // p is gone after this
    va = next;
  }
}

bool Residency::next_to_restore(uintptr_t* cursor, uintptr_t end, StreamHandle consumer, uintptr_t* first,
                                uint32_t* npages) {
  for (uintptr_t page = page_of(*cursor); page < end;) {
    uintptr_t va = away_first(page);
    if (!va) {
      page += page_bytes_;
      continue;
    }
    if (away_.at(va).state == State::evicting) finish_inflight(va, true);
    AwayPage& q = away_.at(va);
    uintptr_t next = va + bytes_of(q);
    if (q.state == State::restoring || q.state == State::restored) {
      if (std::find(q.consumers.begin(), q.consumers.end(), consumer) == q.consumers.end()) {
        if (q.state == State::restoring && consumer != copy_stream_) check(backend_.stream_wait_event(consumer, q.event));
        q.consumers.push_back(consumer);
      }
      page = next;
      continue;
    }
    if (q.device_held) {  // evicted while this restore obtained memory for another page
      unevict_held(va);
      page = next;
      continue;
    }
    *cursor = next;
    *first = va;
    *npages = q.npages;
    return true;
  }
  *cursor = end;
  return false;
}

void Residency::restore_page(uintptr_t va, int32_t id, StreamHandle consumer) {
  auto it = away_.find(va);
  VTA_INVARIANT(it != away_.end() && it->second.state == State::evicted && !it->second.device_held &&
                pages_.pages_of(id) == it->second.npages);
  AwayPage& r = it->second;
  uint32_t npages = r.npages;
  uint64_t bytes = bytes_of(r);
  StreamHandle cs = 0;
  uintptr_t dst = va;
  bool mapped_at_va = false, mapped_at_window = false, window_taken = false;
  try {
    cs = copy_stream();
    if (r.host_mapped) {
      // Mapped mode: fill the device handle through the window; the address keeps showing
      // the host copy until the swap (swap_restored_page).
      if (!window_) {
        window_bytes_ = 2 * (capacity_ / page_bytes_ * page_bytes_);  // room for handles of mixed sizes
        check(backend_.reserve(window_bytes_, page_bytes_, &window_));
        free_window_.insert(window_, window_bytes_);
      }
      if (!free_window_.take_best_fit(bytes, &dst)) fail(VTA_ERR_OUT_OF_MEMORY, "restore window is full");
      window_taken = true;
      check(backend_.map(dst, bytes, pages_.handle_of(id)));
      mapped_at_window = true;
      check(backend_.set_access(dst, bytes));
    } else {
      // Copy mode: the address is unmapped, so nothing can be using it: map at once.
      pages_.map_pages(va, {id});
      mapped_at_va = true;
    }
    copy_slots(dst, r.slots, /*to_host=*/false, cs);
    r.event = events_.record_after_copy(cs);
  } catch (...) {
    // Undo: the bytes are still in the host slot; the handle goes back to the free handles.
    if (mapped_at_va) {
      (void)backend_.stream_synchronize(cs);
      pages_.unmap_range(va, bytes);  // the handle is a free handle again
    } else {
      if (mapped_at_window) {
        (void)backend_.stream_synchronize(cs);
        (void)backend_.unmap(dst, bytes);
      }
      if (window_taken) free_window_.insert(dst, bytes);
      pages_.return_page(id);
    }
    throw;
  }
  r.state = State::restoring;
  r.device_page = id;
  r.window_mapped = mapped_at_window;
  r.window = mapped_at_window ? dst : 0;
  r.consumers.assign(1, consumer);
  r.issued = Clock::now();
  in_flight_ += npages;
  if (consumer != cs) (void)backend_.stream_wait_event(consumer, r.event);  // consumer sees the bytes
}

void Residency::complete_restore(uintptr_t va, AwayPage& p) {
  in_flight_ -= p.npages;
  counters_.restores += p.npages;
  counters_.bytes_restored_total += bytes_of(p);
  counters_.restore_copy_ns += ns_since(p.issued);
  events_.give(p.event);
  p.event = 0;
  if (p.window_mapped) {
    // Mapped mode: work queued before may still read the host copy at the address; the swap
    // waits for it (swap_restored).
    p.state = State::restored;
    return;
  }
  host_pool_->release(p.slots);
  finish_resident(va);
}

void Residency::unmap_window(AwayPage& p) {
  check(backend_.unmap(p.window, bytes_of(p)));
  free_window_.insert(p.window, bytes_of(p));
  p.window_mapped = false;
  p.window = 0;
}

void Residency::swap_restored_page(uintptr_t va, AwayPage& p) {
  VTA_INVARIANT(p.state == State::restored);
  // Each step is recorded in `p` as it succeeds, so a failure can be retried or undone.
  if (p.window_mapped) unmap_window(p);
  if (p.host_mapped) {
    check(backend_.unmap(va, bytes_of(p)));
    p.host_mapped = false;
  }
  try {
    pages_.map_pages(va, {p.device_page});  // all or nothing: on failure the handle is free (unmapped) again
  } catch (...) {
    // The bytes are still in the host slot: back to evicted, its host copy at the address; the
    // device handle (unmapped again by map_pages) goes back to the free handles.
    pages_.return_page(p.device_page);
    p.state = State::evicted;
    p.device_page = -1;
    p.consumers.clear();
    map_host_copy(va, p);
    throw;
  }
  host_pool_->release(p.slots);
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
  if (p.window_mapped) unmap_window(p);  // only the copy stream used the window, and its copy completed
  pages_.return_page(p.device_page);
  p.device_page = -1;
  p.consumers.clear();
  p.state = State::evicted;
}

void Residency::finish_inflight(uintptr_t page, bool wait) {
  uintptr_t va = away_first(page);
  if (!va) return;
  AwayPage& p = away_.at(va);
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

// No block touches the away page any more (their frees completed): forget its evicted copy
// (see ResidencyPort::drop_away_page).
void Residency::drop_away_page(uintptr_t page) {
  finish_inflight(page, true);
  uintptr_t va = away_first(page);
  if (!va) return;  // the restore completed: an ordinary resident handle now
  AwayPage& p = away_.at(va);
  if (p.state == State::restored) {
    swap_restored_page(va, p);  // nothing live is left on it to wait for
    return;
  }
  if (p.host_mapped) check(backend_.unmap(va, bytes_of(p)));
  host_pool_->release(p.slots);
  erase_away(va);
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
    if (p.host_mapped) keep(backend_.unmap(va, bytes_of(p)));
    if (p.window_mapped) keep(backend_.unmap(p.window, bytes_of(p)));
    if (p.device_page >= 0 && p.window_mapped) pages_.return_page(p.device_page);
  }
  away_.clear();
  away_first_.clear();
  in_flight_ = 0;
  victims_->clear();
  if (window_) keep(backend_.free_va(window_, window_bytes_));
  window_ = 0;
  free_window_ = RangeSet();
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
