// Residency transitions: the state machine of away pages (see residency.hpp).
//
// Owns: every step resident -> evicting -> evicted -> restoring [-> restored] -> resident and
// back, over the parts residency.hpp lists, and the engine's setup (the eviction mode) and
// teardown.
// Invariants: those of residency.hpp; in particular each step records in the AwayPage what
// it did as it succeeds, so a failure part-way can be undone or retried and never loses the
// bytes, and no mapping under live or pending-free data changes before quiesce_pages().
#include <string>

#include "evict/residency.hpp"

namespace vta {

namespace {

// The eviction mode: mapped only when asked for; copy otherwise, "auto" included. Copy mode is
// the faster one on every GPU measured (from 32 MiB allocations, H200 2026-11-28: evict 49.5 /
// restore 47.4 GB/s against mapped's 35.1 / 42.9; the H100 of 2026-11-26 in the same order), and
// mapped mode's one extra meaning (an evicted allocation stays readable) is what paging torch's
// activations in place needs, which asks for it by name (docs/eviction.md, "The two modes").
bool choose_mapped_mode(const vta_config_t& config, Backend& backend) {
  if (config.evict_mode > VTA_EVICT_MAPPED) fail(VTA_ERR_INVALID_ARGUMENT, "unknown evict_mode");
  if (config.evict_mode != VTA_EVICT_MAPPED) return false;
  if (!backend.capabilities().host_pages)
    fail(VTA_ERR_BACKEND_UNAVAILABLE,
         "evict_mode=mapped needs host-located VMM pages (CUDA >= 12.2 with HOST_NUMA support)");
  return true;
}

}  // namespace

Residency::Residency(const vta_config_t& config, Backend& backend, PageTable& pages, EventPool& events,
                     const BlockFacts& facts, uint64_t capacity)
    : backend_(backend),
      pages_(pages),
      facts_(facts),
      page_bytes_(pages.page_bytes()),
      mapped_mode_(choose_mapped_mode(config, backend)),
      host_pool_(backend, pages,
                 config.host_capacity_bytes ? config.host_capacity_bytes : HostPool::default_capacity(capacity),
                 mapped_mode_),
      order_(backend, events, facts, page_bytes_),
      window_(pages, capacity),
      away_(page_bytes_) {}

bool Residency::away_span(uintptr_t va, uintptr_t* first, uint64_t* bytes) const {
  const AwayPage* p = away_.over(va, first);
  if (!p) return false;
  *bytes = bytes_of(*p);
  return true;
}

bool Residency::evict_page(uintptr_t page, bool wait) {
  // The whole handle under the page moves: one copy, and later one unmap.
  int32_t id = pages_.page_at(page);
  VTA_INVARIANT(!away_.first_of(page) && id >= 0);
  uintptr_t va = pages_.address_of(id);
  uint32_t npages = pages_.pages_of(id);
  uint64_t bytes = pages_.bytes_of(id);
  HostPool::Slots slots;
  if (!host_pool_.acquire(npages, &slots)) return false;
  // Only the bytes live allocations hold cross the link, there and back: a page shared by small
  // saved tensors moves their bytes, not the whole page.
  std::vector<ByteRange> live;
  EventHandle done = 0;
  try {
    facts_.live_ranges(va, bytes, &live);
    done = order_.copy_out(va, bytes, slots, live);  // after the last use of every allocation on it
  } catch (...) {
    host_pool_.release(slots);  // the handle stays resident, untouched
    throw;
  }
  AwayPage p;
  p.state = State::evicting;
  p.npages = npages;
  p.slots = std::move(slots);
  p.live = std::move(live);
  p.event = done;
  p.issued = Clock::now();
  away_.add(va, p);
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
  counters_.evicted(p.npages, away_.copied_bytes_of(p), p.issued);
  order_.give(p.event);
  p.event = 0;
  if (order_.broken(VTA_DEBUG_BREAK_QUIESCE)) release_held_page(va, p);  // eager, as if nothing could touch it
}

void Residency::quiesce_pages(const std::vector<uintptr_t>& vas) {
  std::vector<StreamOrder::Span> spans;
  spans.reserve(vas.size());
  for (uintptr_t va : vas) {
    const AwayPage* p = away_.find(va);
    spans.push_back(p ? StreamOrder::Span{va, p->npages, &p->consumers} : StreamOrder::Span{va, 1, nullptr});
  }
  order_.quiesce(spans);
}

void Residency::map_host_copy(uintptr_t va, AwayPage& p) {
  VTA_INVARIANT(p.slots.size() == 1);  // mapped mode: one host-located handle
  // All or nothing (the page table's map_side); if it fails, the bytes are still safe in the slot
  // (copy-mode semantics).
  p.host_mapped = pages_.map_side(va, bytes_of(p), p.slots[0].page).is_ok();
}

void Residency::release_held_page(uintptr_t va, AwayPage& p) {
  pages_.unmap_range(va, bytes_of(p));  // the whole handle: one call
  p.device_held = false;
  if (mapped_mode_ && !p.paused) map_host_copy(va, p);  // keep the address valid (a paused one stays unmapped)
}

size_t Residency::release_evicted() {
  auto vas = away_.where([](const AwayPage& p) { return p.state == State::evicted && p.device_held; });
  if (vas.empty()) return 0;
  quiesce_pages(vas);
  for (uintptr_t va : vas) release_held_page(va, away_.at(va));
  return vas.size();
}

bool Residency::finish_evictions() {
  auto vas = away_.where([](const AwayPage& p) { return p.state == State::evicting; });
  for (uintptr_t va : vas) finish_inflight(va, true);
  return !vas.empty();
}

void Residency::finish_resident(uintptr_t va) {
  uint32_t npages = away_.at(va).npages;
  away_.erase(va);
  for (uint32_t k = 0; k < npages; ++k) note_page(va + k * page_bytes_);
}

void Residency::unevict_held(uintptr_t va) {
  AwayPage& p = away_.at(va);
  VTA_INVARIANT(p.state == State::evicted && p.device_held);
  host_pool_.release(p.slots);  // the device handle never stopped holding the bytes
  counters_.taken_back(p.npages);
  finish_resident(va);
}

void Residency::restore_page(uintptr_t va, int32_t id, StreamHandle consumer) {
  AwayPage* found = away_.find(va);
  VTA_INVARIANT(found && found->state == State::evicted && !found->device_held && pages_.pages_of(id) == found->npages);
  AwayPage& r = *found;
  uint32_t npages = r.npages;
  uint64_t bytes = bytes_of(r);
  uintptr_t dst = va;
  bool mapped_at_va = false, mapped_at_window = false, window_taken = false;
  try {
    (void)order_.stream();  // made first: a failure to make it changes nothing
    if (r.host_mapped) {
      // Mapped mode: fill the device handle through the window; the address keeps showing
      // the host copy until the swap (swap_restored_page).
      dst = window_.take(bytes);
      window_taken = true;
      window_.map(dst, bytes, pages_.handle_of(id));  // all or nothing
      mapped_at_window = true;
    } else {
      // Copy mode: the address is unmapped, so nothing can be using it: map at once.
      pages_.map_pages(va, {id});
      mapped_at_va = true;
    }
    r.event = order_.copy_in(dst, r.slots, r.live);
  } catch (...) {
    // Undo: the bytes are still in the host slot; the handle goes back to the free handles.
    if (mapped_at_va) {
      (void)order_.synchronize();  // a copy queued is not running when its pages go
      pages_.unmap_range(va, bytes);  // the handle is a free handle again
    } else {
      if (mapped_at_window) (void)order_.synchronize();
      if (window_taken) window_.abandon(dst, bytes, mapped_at_window);
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
  (void)order_.consumer_after(consumer, r.event);  // consumer sees the bytes
}

void Residency::complete_restore(uintptr_t va, AwayPage& p) {
  in_flight_ -= p.npages;
  counters_.restored(p.npages, away_.copied_bytes_of(p), p.issued);
  order_.give(p.event);
  p.event = 0;
  if (p.window_mapped) {
    // Mapped mode: work queued before may still read the host copy at the address; the swap
    // waits for it (swap_restored).
    p.state = State::restored;
    return;
  }
  host_pool_.release(p.slots);
  finish_resident(va);
}

void Residency::unmap_window(AwayPage& p) {
  window_.unmap(p.window, bytes_of(p));
  p.window_mapped = false;
  p.window = 0;
}

void Residency::swap_restored_page(uintptr_t va, AwayPage& p) {
  VTA_INVARIANT(p.state == State::restored);
  // Each step is recorded in `p` as it succeeds, so a failure can be retried or undone.
  if (p.window_mapped) unmap_window(p);
  if (p.host_mapped) {
    check(pages_.unmap_side(va, bytes_of(p)));
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
  host_pool_.release(p.slots);
  finish_resident(va);
}

void Residency::swap_restored() {
  auto vas = away_.where([](const AwayPage& p) { return p.state == State::restored; });
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
  uintptr_t va = away_.first_of(page);
  if (!va) return;
  AwayPage& p = away_.at(va);
  if (p.state != State::evicting && p.state != State::restoring) return;
  if (!order_.done(p.event, wait)) return;
  if (p.state == State::evicting)
    complete_evict(va, p);
  else
    complete_restore(va, p);
}

void Residency::drain_inflight(bool wait) {
  if (in_flight_ == 0) return;
  auto vas = away_.where(
      [](const AwayPage& p) { return p.state == State::evicting || p.state == State::restoring; });
  for (uintptr_t va : vas) finish_inflight(va, wait);
}

// No block touches the away page any more (their frees completed): forget its evicted copy
// (see ResidencyPort::drop_away_page).
void Residency::drop_away_page(uintptr_t page) {
  finish_inflight(page, true);
  uintptr_t va = away_.first_of(page);
  if (!va) return;  // the restore completed: an ordinary resident handle now
  AwayPage& p = away_.at(va);
  if (p.state == State::restored) {
    swap_restored_page(va, p);  // nothing live is left on it to wait for
    return;
  }
  if (p.host_mapped) check(pages_.unmap_side(va, bytes_of(p)));
  host_pool_.release(p.slots);
  if (p.paused) paused_pages_ -= p.npages;
  away_.erase(va);
}

void Residency::close() {
  Status first;
  auto keep = [&](const Status& s) {
    if (!s.is_ok() && first.is_ok()) first = s;
  };
  keep(order_.synchronize());
  for (auto& [va, p] : away_) {
    if ((p.state == State::evicting || p.state == State::restoring) && p.event) keep(order_.wait(p.event));
    if (p.host_mapped) keep(pages_.unmap_side(va, bytes_of(p)));
    if (p.window_mapped) keep(window_.unmap_at_close(p.window, bytes_of(p)));
    if (p.device_page >= 0 && p.window_mapped) pages_.return_page(p.device_page);
  }
  away_.clear();
  in_flight_ = paused_pages_ = 0;
  victims_->clear();
  keep(window_.close());
  try {
    host_pool_.release_all();
  } catch (const Error& e) {
    keep(Status(e.code(), e.what()));
  }
  keep(order_.destroy());
  check(first);
}

}  // namespace vta
