// AllocPolicy implementation.
//
// Owns: the order of an allocation's steps (begin_allocate, resume: which fit of which try comes
// next), the take-handle order, where freed memory goes, and the notices it sends the eviction
// engine (ResidencyPort); where a block goes and the mapping under it is alloc_policy_placement.cpp.
// Invariants: the policy and its invariants are in alloc_policy.hpp.
#include "alloc/alloc_policy.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

#include "blocks/text.hpp"

namespace vta {
namespace {

// The virtual bytes of one reservation: the configured size (already checked against
// kMaxSpaceBytes) in whole pages, or 2 x capacity (at least 64 pages), capped at the whole
// pages of kMaxSpaceBytes: no allocation is larger, and a bigger default could not be reserved.
uint64_t reservation_bytes(const vta_config_t& config, uint64_t capacity, uint64_t page) {
  if (config.reservation_bytes) return AllocPolicy::round_up(config.reservation_bytes, page);
  return std::min(std::max<uint64_t>(2 * capacity, 64 * page), std::max(kMaxSpaceBytes / page * page, page));
}

// The largest extent, in pages: the configured bytes (0: the default) in whole pages; fewer
// than two pages means no extents. Callers built before extent_bytes was appended get the default.
uint64_t extent_max_pages(const vta_config_t& config, uint64_t page) {
  uint64_t bytes = config.struct_size >= offsetof(vta_config_t, extent_bytes) + sizeof(uint64_t) ? config.extent_bytes : 0;
  if (bytes > kMaxSpaceBytes) fail(VTA_ERR_INVALID_ARGUMENT, "extent_size is above 2^46 bytes");
  uint64_t pages = (bytes ? bytes : kDefaultExtentBytes) / page;
  return pages >= 2 ? std::min<uint64_t>(pages, UINT32_MAX) : 0;
}

}  // namespace

AllocPolicy::AllocPolicy(const vta_config_t& config, Backend& backend, PageTable& pages, EventPool& events,
                         uint64_t capacity)
    : backend_(backend),
      pages_(pages),
      events_(events),
      capacity_(capacity),
      page_bytes_(pages.page_bytes()),
      small_threshold_(config.small_threshold_bytes ? config.small_threshold_bytes
                                                    : std::min<uint64_t>(1ull << 20, page_bytes_)),
      extent_max_pages_(extent_max_pages(config, page_bytes_)),
      extent_min_pages_(std::max<uint64_t>(
          2, (std::min<uint64_t>(kExtentMinBytes, extent_max_pages_ * page_bytes_) + page_bytes_ - 1) / page_bytes_)),
      live_(pages),
      pending_(events, page_bytes_, backend.kind()),
      uses_(events, page_bytes_, backend.kind()),
      free_(pages, reservation_bytes(config, capacity, page_bytes_)),
      cached_(pages) {
  if (small_threshold_ > page_bytes_)
    fail(VTA_ERR_INVALID_ARGUMENT, "small_threshold must not exceed the page size");
}

AllocPolicy::Request AllocPolicy::request(uint64_t nbytes) {
  if (nbytes == 0) fail(VTA_ERR_INVALID_ARGUMENT, "allocation size must be positive");
  if (nbytes > kMaxAllocationBytes)
    fail(VTA_ERR_INVALID_ARGUMENT, "allocation of " + std::to_string(nbytes) + " bytes is larger than any address space can reserve");
  uint64_t rounded = round_up(nbytes, kMinAlignment);
  if (round_up(rounded, page_bytes_) > capacity_) throw_oom(nbytes);  // no placement fits in fewer pages
  return Request{nbytes, rounded, nbytes <= small_threshold_};
}

AllocPolicy::Step AllocPolicy::begin_allocate(Placement& p) {
  const Request& r = p.request_;
  region_ = r.region;
  if (!uses_.empty()) poll_uses(false);
  if (pages_.pages_held() > pages_.capacity_pages()) shed_over_limit();
  retried_ = false;
  // Neither needs an event nor a driver call: a block this stream freed, or free memory that is
  // mapped already.
  uintptr_t address = 0;
  if (take_same_stream(r, p.stream_, &address) || take_mapped(r.rounded, &address)) {
    p.at_ = address;
    return make_live(p);
  }
  // The memory other streams freed (and what this one freed that this request does not fit)
  // needs their events now: one record per stream with open frees, then a poll.
  settle();
  p.released_ = pending_.released();
  return advance(p);
}

AllocPolicy::Step AllocPolicy::resume(Placement& p, bool freed) {
  VTA_INVARIANT(p.at_ != 0 && p.run_ < p.runs_.size());
  region_ = p.request_.region;
  // Not freed: as if take_handle had nothing for good. The run's handles go back, and the fit
  // with them (a refusal alone falls back to one-page handles, and this was none).
  if (!freed && !run_failed(p, false)) drop_fit(p);
  return advance(p);
}

AllocPolicy::Step AllocPolicy::advance(Placement& p) {
  for (;;) {
    if (!p.at_ && !next_fit(p)) {
      if (retried_) num_alloc_retries_++;
      return Step::failed;
    }
    switch (map_runs(p)) {
      case Mapping::mapped:
        return make_live(p);
      case Mapping::needs_page:
        return Step::needs_page;
      case Mapping::dropped:
        break;  // the next fit
    }
  }
}

bool AllocPolicy::next_fit(Placement& p) {
  using Stage = Placement::Stage;
  switch (p.stage_) {
    case Stage::start:
      p.stage_ = Stage::best_fit;
      break;
    case Stage::best_fit:  // it needed more pages than could be had: the place that needs the fewest
      p.stage_ = Stage::fewest;
      break;
    case Stage::fewest:
      if (pending_.count() || uses_.freed_count() || pending_.released() != p.released_) {
        // Frees that waited for their streams (recorded ones too) may have left a block this
        // request fits in.
        retried_ = true;
        poll_uses(true);
        drain_pending(true);
        p.stage_ = Stage::retry_best_fit;
        break;
      }
      [[fallthrough]];
    case Stage::retry_fewest:
      // The last resort: the extents blocks use only in part give their untouched pages back
      // (alloc_policy_split.cpp), and the request takes the place that needs the fewest pages.
      if (!split_extents_for_bytes(p.request_.rounded, p.stream_)) {
        p.stage_ = Stage::failed;
        return false;
      }
      p.stage_ = Stage::split_fewest;
      break;
    case Stage::retry_best_fit:
      p.stage_ = Stage::retry_fewest;
      break;
    case Stage::split_fewest:
    case Stage::failed:
      p.stage_ = Stage::failed;
      return false;
  }
  bool best = p.stage_ == Stage::best_fit || p.stage_ == Stage::retry_best_fit;
  uint64_t bytes = p.request_.rounded;
  hold_fit(p, best ? take_free(bytes, Fit::any) : take_fewest(bytes));
  return true;
}

AllocPolicy::Step AllocPolicy::make_live(Placement& p) {
  const Request& r = p.request_;
  uintptr_t address = p.at_;
  p.at_ = 0;  // the block's now: nothing for abandon() to give back (a pending free it took included)
  p.runs_.clear();
  p.run_ = 0;
  p.address_ = address;
  if (retried_) num_alloc_retries_++;
  Allocation a{r.rounded, r.requested, p.stream_, r.small};
  a.region = r.region;
  live_.add(address, a);
  // Only its first and last pages can hold other allocations, whose pages the victim policy may list.
  if (live_.evictable_bytes()) {
    port_->note_use(address, 1);
    port_->note_use(address + r.rounded - 1, 1);
  }
  return Step::done;
}

AllocPolicy::Take AllocPolicy::take_handle(uint32_t npages, int32_t* id) {
  // Cheapest first: a free handle of this size (or a new one under capacity, unless the cached
  // handles exceed their allowance: then one of them, reuse_before_growth), a cached extent of
  // this size, room made by releasing free handles of other sizes, a cached handle, memory freed
  // but waiting for its stream.
  auto cached = [&](int32_t h) { return is_cached(h); };
  for (;;) {
    reuse_before_growth(npages);
    bool refused = false;
    if (npages == 1 ? pages_.acquire_page(id) : pages_.acquire_extent(npages, id, &refused)) return Take::taken;
    if (refused) return Take::refused;
    // A cached extent of this very size: unmapped, it is the free extent taken above (no
    // release, no create).
    int32_t victim = -1;
    if (npages > 1 && cached_.take_oldest(npages, cached, &victim)) {
      pages_.unmap_range(pages_.address_of(victim), pages_.bytes_of(victim));
      num_page_reclaims_++;
      continue;
    }
    if (pages_.release_free_for(npages, /*pages_first=*/npages > 1)) continue;
    retried_ = true;
    if (reclaim_one_handle()) continue;
    if (uses_.freed_count() && poll_uses(true)) continue;  // now pending frees: drained next
    if (pending_.count() && drain_pending(true)) continue;  // none: streams capturing a graph
    return Take::spent;
  }
}

bool AllocPolicy::reuse_before_growth(uint32_t npages) {
  uint64_t cached = cached_.pages(), used = pages_.pages_mapped() - cached;
  uint64_t allowance = std::max(used / kCachedShare, kCachedFloorPages);
  if (cached <= allowance) return false;
  auto is = [&](int32_t h) { return is_cached(h); };
  int32_t id = -1;
  bool same = cached_.take_oldest(npages, is, &id);  // unmapped, it is the free handle acquired next
  if (!same) {
    // One of another size only from what is over the allowance: a cached extent the next step
    // of a loop will want again is not broken up for a smaller request while the cache is small.
    if (!cached_.peek_oldest(&id) || pages_.pages_of(id) > cached - allowance || !is(id)) return false;
    cached_.forget(id);
  }
  pages_.unmap_range(pages_.address_of(id), pages_.bytes_of(id));
  if (!same) pages_.release_free(id);  // its memory goes to the handle made next
  num_page_reclaims_++;
  return true;
}

bool AllocPolicy::is_cached(int32_t id) const {
  uintptr_t va = pages_.address_of(id);
  return va != 0 && free_.is_free(va, pages_.bytes_of(id)) && !(port_->any_away() && port_->is_away(va));
}

void AllocPolicy::refresh_cached(uintptr_t lo, uintptr_t hi) {
  cached_.refresh(lo, hi, [&](int32_t id) { return is_cached(id); });
}

bool AllocPolicy::reclaim_one_handle() {
  // The handle cached longest: the least likely to be reused soon. Its bytes were freed and
  // their events completed, so nothing can still touch it.
  int32_t id = -1;
  if (!cached_.take_oldest(0, [&](int32_t h) { return is_cached(h); }, &id)) return false;
  pages_.unmap_range(pages_.address_of(id), pages_.bytes_of(id));
  num_page_reclaims_++;
  return true;
}

// A limit lowered below the pages held (torch's set_per_process_memory_fraction) leaves cached
// pages over it, and a cached page is reused without a capacity check (it is held already): an
// allocation could then end above the limit, as one did on the H200 (2026-11-28). The cached
// pages go first, as PyTorch frees its cached blocks before it lets an allocation pass its cap.
void AllocPolicy::shed_over_limit() {
  settle();  // frees whose streams are done become cached; one still running stays (its stream may reuse it)
  unmap_cached();
  pages_.release_free_pages();
}

void AllocPolicy::unmap_cached() {
  int32_t id = -1;
  while (cached_.take_oldest(0, [&](int32_t h) { return is_cached(h); }, &id))
    pages_.unmap_range(pages_.address_of(id), pages_.bytes_of(id));
}

void AllocPolicy::free(uintptr_t address) {
  auto it = live_.find_live(address);
  const Allocation a = live_.erase(it);
  // Its pages may have become (un)evictable: those it shared with others (its first and last)
  // are looked at again, the ones between are no candidates any more, in one step whatever its
  // size (were it not evictable, none of them was one).
  if (a.evictable || live_.evictable_bytes()) port_->note_left(address, a.size);
  retire(address, a, false);
  if (!uses_.empty()) poll_uses(false);
  drain_pending(false);  // earlier batches whose events completed (no call while all are open)
}

void AllocPolicy::retire(uintptr_t address, const Allocation& a, bool kept) {
  std::vector<StreamHandle> streams = uses_.take(address);
  PendingFree f{address, a.size};
  if (!streams.empty())
    uses_.await(f, a.stream, streams, kept);  // no reuse, not even on its stream, before their events
  else if (!kept)
    pending_.push(a.stream, f);  // no event yet: see pending_frees.hpp
}

void AllocPolicy::record_stream(uintptr_t address, StreamHandle stream) {
  auto it = live_.find_live(address);
  uses_.record(address, it->second.stream, stream);
}

void AllocPolicy::keep(uintptr_t address) {
  auto it = live_.find_live(address);
  const Allocation a = it->second;
  live_.keep(it);
  if (a.evictable || live_.evictable_bytes()) port_->note_left(address, a.size);  // kept: none of its pages is a candidate
  retire(address, a, true);
}

bool AllocPolicy::unkeep(uintptr_t address, uint64_t requested) {
  auto it = live_.find_kept(address);
  if (uses_.waiting(address)) return false;
  if (port_->any_away())  // a kept block is never evicted: away means its region is paused
    for (uintptr_t va = page_of(address); va < address + it->second.size; va += page_bytes_)
      if (port_->is_away(va)) return false;
  live_.unkeep(it, requested);
  return true;
}

void AllocPolicy::release_kept(uintptr_t address) {
  auto it = live_.find_kept(address);
  const Allocation a = live_.erase_kept(it);
  if (uses_.waiting(address)) {
    uses_.mark_freed(address);  // goes on to the pending frees once its streams are done
    return;
  }
  pending_.push(a.stream, PendingFree{address, a.size});
}

uint64_t AllocPolicy::poll_uses(bool wait) {
  return uses_.poll(wait, [&](StreamHandle own, const PendingFree& f) { pending_.push(own, f); });
}

void AllocPolicy::set_limit(uint64_t limit_bytes) {
  if (limit_bytes > capacity_) fail(VTA_ERR_INVALID_ARGUMENT, "the limit is above the space's capacity");
  limit_bytes_ = limit_bytes;
  uint64_t pages = limit_bytes ? std::max<uint64_t>(1, limit_bytes / page_bytes_) : capacity_ / page_bytes_;
  pages_.set_capacity_pages(pages);
}

uint64_t AllocPolicy::drain_pending(bool wait) {
  if (wait && pending_.count()) num_sync_all_streams_++;
  if (wait) pending_.seal_all();
  return pending_.drain(wait, skip_free_wait_, [&](uintptr_t address, uint64_t size) { release_block(address, size); });
}

void AllocPolicy::settle() {
  pending_.seal_all();
  drain_pending(false);
}

void AllocPolicy::settle_stream(StreamHandle stream) {
  pending_.seal_stream(stream);
}

void AllocPolicy::release_block(uintptr_t address, uint64_t size) {
  free_.give(address, size);
  if (port_->any_away()) {
    // An away page no block touches any more loses its copy: unmapped again, or (a device page
    // still held there) cached like any freed page.
    for (uintptr_t va = page_of(address); va < address + size;) {
      uintptr_t first = 0;
      uint64_t span = 0;
      if (!port_->away_span(va, &first, &span)) {
        va += page_bytes_;
        continue;
      }
      if (free_.is_free(first, span)) port_->drop_away_page(first);  // may complete a restore: then resident
      va = first + span;
    }
  }
  refresh_cached(address, address + size);
}

[[noreturn]] void AllocPolicy::throw_oom(uint64_t requested, const char* why, bool count) {
  if (count) num_ooms_++;
  uint64_t mapped = pages_.pages_mapped() * page_bytes_;
  uint64_t cached = cached_.pages() * page_bytes_;
  uint64_t touched = touched_pages() * page_bytes_;
  uint64_t idle = mapped > cached + touched ? mapped - cached - touched : 0;
  std::string msg = "vtalloc out of memory: " + std::string(why ? why : "tried to allocate") + " " + mib(requested) +
                    " (" + std::to_string(requested) + " bytes); capacity " + mib(capacity_) +
                    (limit_bytes_ && limit_bytes_ < capacity_
                         ? " (limited to " + mib(limit_bytes_) + " by a memory fraction or limit)"
                         : std::string()) +
                    ", " + mib(live_.active_bytes()) + " held by live allocations (" + mib(live_.evictable_bytes()) +
                    " evictable), " + mib(mapped) + " mapped (" + mib(cached) + " of it cached, " + mib(touched) +
                    " on pages blocks touch";
  if (idle)
    msg += ", " + mib(idle) +
           " untouched under extents that blocks use in part and that were not split: splitting them would not make "
           "room, or they are away, kept by a graph pool or on a capturing stream";
  msg += "), " + mib(pending_.bytes()) + " awaiting stream completion, host pool " +
         mib(port_->host_pool_used_bytes()) + " of " + mib(port_->host_pool_capacity_bytes()) + " used";
  std::string refusal = pages_.take_driver_refusal();
  if (!refusal.empty()) msg += "; the driver refused a new page: " + refusal;
  throw OutOfMemory(msg, requested, capacity_, mapped);
}

uint64_t AllocPolicy::touched_pages() const {
  uint64_t n = 0;
  pages_.for_each_page([&](int32_t, uint32_t, uintptr_t va) {
    if (va && !free_.is_free(va, page_bytes_)) n++;
  });
  return n;
}

void AllocPolicy::fill_stats(vta_stats_t* s) const {
  live_.fill_stats(s);
  s->capacity_bytes = capacity_;
  s->page_bytes = page_bytes_;
  s->small_threshold_bytes = small_threshold_;
  s->cached_bytes = cached_bytes();
  s->pending_free_bytes = pending_.bytes() + uses_.freed_bytes();
  s->num_alloc_retries = num_alloc_retries_;
  s->num_sync_all_streams = num_sync_all_streams_;
  s->num_ooms = num_ooms_;
  s->num_page_reclaims = num_page_reclaims_;
  s->num_extent_splits = num_extent_splits_;
  s->num_extent_splits_staged = num_extent_splits_staged_;
  s->extent_split_pages = extent_split_pages_;
}

void AllocPolicy::clear() {
  pending_.clear();
  uses_.clear();
  live_.clear();
  free_.clear();
  cached_.clear();
}

}  // namespace vta
