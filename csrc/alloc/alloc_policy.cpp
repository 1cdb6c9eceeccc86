// AllocPolicy implementation.
//
// Owns: the placement of a request, the obtain-page order and where freed memory goes.
// Invariants: the policy and its invariants are in alloc_policy.hpp.
#include "alloc/alloc_policy.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

#include "alloc/text.hpp"

namespace vta {
namespace {

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// The virtual bytes of one reservation: the configured size (already checked against
// kMaxSpaceBytes) in whole pages, or 2 x capacity (at least 64 pages), capped at the whole
// pages of kMaxSpaceBytes: no allocation is larger, and a bigger default could not be reserved.
uint64_t reservation_bytes(const vta_config_t& config, uint64_t capacity, uint64_t page) {
  if (config.reservation_bytes) return round_up(config.reservation_bytes, page);
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

AllocPolicy::AllocPolicy(const vta_config_t& config, PageTable& pages, EventPool& events, uint64_t capacity,
                         int backend_kind)
    : pages_(pages),
      capacity_(capacity),
      page_bytes_(pages.page_bytes()),
      small_threshold_(config.small_threshold_bytes ? config.small_threshold_bytes
                                                    : std::min<uint64_t>(1ull << 20, page_bytes_)),
      live_(pages),
      pending_(events, page_bytes_, backend_kind),
      uses_(events, page_bytes_, backend_kind),
      slabs_(page_bytes_),
      extent_max_pages_(extent_max_pages(config, page_bytes_)),
      extent_min_pages_(std::max<uint64_t>(
          2, (std::min<uint64_t>(kExtentMinBytes, extent_max_pages_ * page_bytes_) + page_bytes_ - 1) / page_bytes_)),
      ranges_(pages, reservation_bytes(config, capacity, page_bytes_)) {
  if (small_threshold_ > page_bytes_)
    fail(VTA_ERR_INVALID_ARGUMENT, "small_threshold must not exceed the page size");
}

AllocPolicy::Request AllocPolicy::request(uint64_t nbytes) {
  if (nbytes == 0) fail(VTA_ERR_INVALID_ARGUMENT, "allocation size must be positive");
  if (nbytes > kMaxAllocationBytes)
    fail(VTA_ERR_INVALID_ARGUMENT, "allocation of " + std::to_string(nbytes) + " bytes is larger than any address space can reserve");
  bool small = nbytes <= small_threshold_;
  uint64_t rounded = small ? round_up(nbytes, kMinAlignment) : round_up(nbytes, page_bytes_);
  if (rounded > capacity_) throw_oom(nbytes);
  return Request{nbytes, rounded, small};
}

uintptr_t AllocPolicy::allocate(const Request& r, StreamHandle stream, bool may_evict) {
  uintptr_t address = 0;
  if (!uses_.empty()) poll_uses(false);
  retried_ = false;
  bool ok = take_same_stream(r, stream, &address);  // no driver call
  if (!ok) {
    // The memory other streams freed (and what this one freed that this request does not fit)
    // needs their events now: one record per stream with open frees, then a poll.
    settle();
    uint64_t released = pending_.released();
    ok = try_allocate(r.rounded, r.small, may_evict, &address);
    if (!ok && (pending_.count() || uses_.freed_count() || pending_.released() != released)) {
      // Frees that waited for their streams (recorded ones too) may have left a block this
      // request fits in.
      retried_ = true;
      poll_uses(true);
      drain_pending(true);
      ok = try_allocate(r.rounded, r.small, may_evict, &address);
    }
  }
  if (retried_) num_alloc_retries_++;
  if (!ok) throw_oom(r.requested);
  live_.add(address, Allocation{r.rounded, r.requested, stream, r.small});
  if (r.small) port_->forget_lru(page_of(address));  // now shared with a pinned block
  return address;
}

bool AllocPolicy::take_same_stream(const Request& r, StreamHandle stream, uintptr_t* out) {
  // A block on a page that is away is not reused here: it returns through the eviction engine.
  auto usable = [&](uintptr_t address, uint64_t bytes) {
    if (!r.small && !pages_.handle_boundary(address + bytes)) return false;  // would split an extent
    if (!port_->any_away()) return true;
    for (uintptr_t va = page_of(address); va < address + bytes; va += page_bytes_)
      if (port_->is_away(va)) return false;
    return true;
  };
  return pending_.take(stream, r.rounded, r.small, usable, out);
}

bool AllocPolicy::try_allocate(uint64_t rounded, bool small, bool may_evict, uintptr_t* out) {
  if (!small) {
    if (ranges_.take_cached(rounded, out)) return true;  // cached: no driver call
    return map_range(rounded / page_bytes_, may_evict, out);
  }
  uintptr_t block = 0;
  if (!slabs_.take_block(rounded, &block)) {
    uintptr_t slab = 0;
    if (!ranges_.take_cached(page_bytes_, &slab) && !map_range(1, may_evict, &slab)) return false;
    block = slabs_.take_block_in_new_slab(slab, rounded);
  }
  slabs_.count_taken(block, rounded);
  *out = block;
  return true;
}

std::vector<uint32_t> AllocPolicy::handle_plan(size_t npages) const {
  if (!extent_max_pages_ || npages < extent_min_pages_) return std::vector<uint32_t>(npages, 1);
  // Size classes extent_max_pages_, half of it, a quarter ... down to two pages, largest first,
  // and one page for what is left: few handles, and of a few sizes only, so a freed extent fits
  // the next large allocation of any size that contains its class (docs/eviction.md).
  std::vector<uint32_t> plan;
  size_t left = npages;
  for (uint64_t c = extent_max_pages_; c >= 2; c /= 2)
    while (left >= c) {
      plan.push_back(static_cast<uint32_t>(c));
      left -= c;
    }
  plan.insert(plan.end(), left, 1);
  return plan;
}

bool AllocPolicy::map_range(size_t npages, bool may_evict, uintptr_t* out) {
  bool driver_oom = false;
  auto obtain = [&](uint32_t n, int32_t* id) { return obtain_handle(n, id, may_evict, &driver_oom); };
  // A cached range grown in place keeps its pages where they are: only the rest is mapped
  // (reusing freed memory elsewhere would unmap and map each of its handles again).
  uintptr_t start = 0;
  size_t cached = 0, bytes = npages * page_bytes_;
  if (npages > 1 && ranges_.take_growable(bytes, &start, &cached)) {
    if (ranges_.map_growth(start, cached, bytes, handle_plan((bytes - cached) / page_bytes_), obtain)) {
      *out = start;
      return true;
    }
    if (!driver_oom) return false;  // the whole range would need as much memory again
    driver_oom = false;
  }
  std::vector<uint32_t> plan = handle_plan(npages);
  if (ranges_.map_range(plan, obtain, out)) return true;
  if (!driver_oom) return false;
  // The driver refused an extent's size although capacity was there: one-page handles.
  return ranges_.map_range(std::vector<uint32_t>(npages, 1), obtain, out);
}

bool AllocPolicy::obtain_handle(uint32_t npages, int32_t* id, bool may_evict, bool* driver_oom) {
  // Cheapest first: a free handle of this size (or a new one under capacity), room made by
  // releasing free handles of other sizes, a cached handle, memory freed but waiting for its
  // stream, and only then what the eviction engine can free (ResidencyPort::free_device_page).
  for (;;) {
    bool refused = false;
    if (npages == 1 ? pages_.acquire_page(id) : pages_.acquire_extent(npages, id, &refused)) return true;
    if (refused) {
      if (driver_oom) *driver_oom = true;
      return false;
    }
    // A cached extent of this very size: unmapped, it is the free extent taken above (no
    // release, no create).
    if (npages > 1 && reclaim_cached_extent(npages)) continue;
    if (pages_.release_free_for(npages, /*pages_first=*/npages > 1)) continue;
    retried_ = true;
    if (reclaim_one_page()) continue;
    if (uses_.freed_count() && poll_uses(true)) continue;  // now pending frees: drained next
    if (pending_.count() && drain_pending(true)) continue;  // none: streams capturing a graph
    if (!port_->free_device_page(may_evict)) return false;
  }
}

bool AllocPolicy::reclaim_one_page() {
  // Cached handles under free ranges first (smallest range: the least useful for reuse),
  // then the spare empty slab. Pages here were freed and their events completed.
  uintptr_t victim = 0;
  size_t bytes = page_bytes_;
  if (!ranges_.take_cached_page(&victim, &bytes) && !slabs_.take_spare(&victim)) return false;
  ranges_.unmap(victim, bytes);
  num_page_reclaims_++;
  return true;
}

bool AllocPolicy::reclaim_cached_extent(uint32_t npages) {
  uintptr_t va = 0;
  if (!ranges_.take_cached_extent(npages, &va)) return false;
  ranges_.unmap(va, uint64_t{npages} * page_bytes_);
  num_page_reclaims_++;
  return true;
}

void AllocPolicy::unmap_cached() {
  uintptr_t spare = 0;
  if (slabs_.take_spare(&spare)) ranges_.add_cached(spare, page_bytes_);
  ranges_.unmap_cached();
}

void AllocPolicy::free(uintptr_t address) {
  auto it = live_.find_live(address);
  const Allocation a = live_.erase(it);
  // Its pages may have become (un)evictable; with no evictable allocation left, none can be.
  if (a.evictable || live_.evictable_bytes()) port_->touch_range(address, a.size);
  retire(address, a, false);
  if (!uses_.empty()) poll_uses(false);
  drain_pending(false);  // earlier batches whose events completed (no call while all are open)
}

void AllocPolicy::retire(uintptr_t address, const Allocation& a, bool kept) {
  std::vector<StreamHandle> streams = uses_.take(address);
  PendingFree f{address, a.size, a.small};
  if (!streams.empty())
    uses_.await(f, a.stream, streams, kept);  // no reuse, not even on its stream, before their events
  else if (!kept)
    pending_.push(a.stream, f);  // no event yet: see pending_frees.hpp
}

void AllocPolicy::record_stream(uintptr_t address, StreamHandle stream) {
  auto it = live_.find_live(address);
  uses_.record(address, it->second.stream, stream);
}

void AllocPolicy::add_page_streams(uintptr_t va, std::vector<StreamHandle>* streams) const {
  live_.for_each_on_page(va, [&](uintptr_t address, const Allocation& a) {
    add_stream(streams, a.stream);
    uses_.add_recorded(address, streams);
  });
}

void AllocPolicy::keep(uintptr_t address) {
  auto it = live_.find_live(address);
  const Allocation a = it->second;
  live_.keep(it);
  if (a.evictable || live_.evictable_bytes()) port_->touch_range(address, a.size);
  retire(address, a, true);
}

bool AllocPolicy::unkeep(uintptr_t address, uint64_t requested) {
  auto it = live_.find_kept(address);
  if (uses_.waiting(address)) return false;
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
  pending_.push(a.stream, PendingFree{address, a.size, a.small});
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
  return pending_.drain(wait, skip_free_wait_,
                        [&](uintptr_t address, uint64_t size, bool small) { release_block(address, size, small); });
}

void AllocPolicy::settle() {
  pending_.seal_all();
  drain_pending(false);
}

void AllocPolicy::settle_stream(StreamHandle stream) {
  pending_.seal_stream(stream);
}

void AllocPolicy::release_block(uintptr_t address, uint64_t size, bool small) {
  if (small)
    release_small_block(address, size);
  else
    release_large_range(address, size);
}

void AllocPolicy::release_large_range(uintptr_t address, uint64_t size) {
  if (!port_->any_away()) {  // every page is resident: the whole range stays mapped (cached)
    ranges_.add_cached(address, size);
    return;
  }
  // Resident pages stay mapped (cached); evicted ones lose their copy and become unmapped VA.
  uintptr_t run = address;
  bool run_mapped = true;
  auto flush = [&](uintptr_t end) {
    if (end == run) return;
    ranges_.add(run, end - run, run_mapped);
    run = end;
  };
  for (uintptr_t va = address; va < address + size; va += page_bytes_) {
    if (port_->is_away(va)) port_->drop_away_page(va);  // may complete a restore: then resident
    bool mapped = pages_.page_at(va) >= 0;
    if (mapped != run_mapped) {
      flush(va);
      run_mapped = mapped;
    }
  }
  flush(address + size);
}

void AllocPolicy::release_small_block(uintptr_t address, uint64_t size) {
  uintptr_t slab = page_of(address);
  uint64_t used = slabs_.count_released(slab, size);
  if (port_->is_away(slab)) {
    // The slab page is evicted: its free blocks wait in the stash until it is restored.
    if (used != 0) {
      slabs_.stash_block(slab, address, size);
      return;
    }
    port_->drop_away_page(slab);
    slabs_.forget(slab);
    ranges_.add(slab, page_bytes_, pages_.page_at(slab) >= 0);  // mapped if a restore completed while dropping
    return;
  }
  slabs_.add_free_block(address, size);
  if (used != 0 || slabs_.keep_as_spare(slab)) return;
  slabs_.remove_empty(slab);
  ranges_.add_cached(slab, page_bytes_);
}

[[noreturn]] void AllocPolicy::throw_oom(uint64_t requested, const char* why) {
  num_ooms_++;
  uint64_t mapped = pages_.pages_mapped() * page_bytes_;
  std::string msg = "vtalloc out of memory: " + std::string(why ? why : "tried to allocate") + " " + mib(requested) +
                    " (" + std::to_string(requested) + " bytes); capacity " + mib(capacity_) + ", " +
                    mib(live_.active_bytes()) + " held by live allocations (" + mib(live_.evictable_bytes()) +
                    " evictable), " + mib(mapped) + " mapped, " + mib(pending_.bytes()) +
                    " awaiting stream completion, host pool " + mib(port_->host_pool_used_bytes()) + " of " +
                    mib(port_->host_pool_capacity_bytes()) + " used";
  throw OutOfMemory(msg, requested, capacity_, mapped);
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
}

void AllocPolicy::clear() {
  pending_.clear();
  uses_.clear();
  live_.clear();
  ranges_.clear();
  slabs_.clear();
}

}  // namespace vta
