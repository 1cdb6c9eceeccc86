// AddressSpace implementation; the policy and its invariants are in address_space.hpp.
#include "space/address_space.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "backend/counters.hpp"
#include "vmm/page_geometry.hpp"

namespace vta {
namespace {

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

std::string hex(uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

std::string mib(uint64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

std::unique_ptr<AddressSpace> AddressSpace::create(const vta_config_t& config) {
  if (config.flags & ~VTA_CONFIG_LEASED) fail(VTA_ERR_INVALID_ARGUMENT, "unknown vta_config_t flags");
  PageGeometry g = make_page_geometry(config);
  return std::unique_ptr<AddressSpace>(new AddressSpace(std::move(g.backend), config, g.capacity_bytes, g.page_bytes));
}

AddressSpace::AddressSpace(std::unique_ptr<Backend> backend, const vta_config_t& config, uint64_t capacity,
                           size_t page_bytes)
    : backend_(std::make_unique<FaultInjectingBackend>(std::move(backend))),
      backend_kind_(backend_->kind()),
      device_(backend_->device()),
      capacity_(capacity),
      page_bytes_(page_bytes),
      small_threshold_(config.small_threshold_bytes ? config.small_threshold_bytes
                                                    : std::min<uint64_t>(1ull << 20, page_bytes)),
      reservation_bytes_(config.reservation_bytes ? round_up(config.reservation_bytes, page_bytes)
                                                  : std::max<uint64_t>(2 * capacity, 64 * page_bytes)),
      pages_(*backend_, page_bytes, capacity),
      small_free_(page_bytes) {
  if (small_threshold_ > page_bytes_)
    fail(VTA_ERR_INVALID_ARGUMENT, "small_threshold must not exceed the page size");
  if (config.flags & VTA_CONFIG_LEASED) {
    leased_ = true;
    pages_.set_capacity_pages(0);  // grows with each imported page, up to capacity_
  }
  init_eviction(config);
  stats_.struct_size = sizeof(vta_stats_t);
  global_counters().live_spaces++;
}

AddressSpace::~AddressSpace() {
  try {
    close();
  } catch (...) {
    // A driver failure while tearing down has been reported by close() if anyone asked.
  }
}

void AddressSpace::check_open_locked() const {
  if (closed_) fail(VTA_ERR_CLOSED, "the address space is closed");
}

uintptr_t AddressSpace::malloc(uint64_t nbytes, StreamHandle stream, bool allow_evict) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  evict_allowed_ = allow_evict;
  struct Restore {
    bool& flag;
    ~Restore() { flag = true; }
  } restore{evict_allowed_};
  if (nbytes == 0) fail(VTA_ERR_INVALID_ARGUMENT, "allocation size must be positive");
  if (nbytes > kMaxAllocationBytes)
    fail(VTA_ERR_INVALID_ARGUMENT, "allocation of " + std::to_string(nbytes) + " bytes is larger than any address space can reserve");
  bool small = nbytes <= small_threshold_;
  uint64_t rounded = small ? round_up(nbytes, kMinAlignment) : round_up(nbytes, page_bytes_);
  if (rounded > capacity_) throw_oom_locked(nbytes);

  drain_pending_locked(false);
  drain_inflight_locked(false);
  uintptr_t address = 0;
  uint64_t released = pending_released_;
  bool ok = try_malloc_locked(rounded, small, &address);
  if (!ok && (pending_count_ || pending_released_ != released)) {
    // Frees that waited for their stream may have left a block this request fits in.
    drain_pending_locked(true);
    ok = try_malloc_locked(rounded, small, &address);
  }
  if (!ok) throw_oom_locked(nbytes);

  live_[address] = Allocation{rounded, nbytes, stream, small};
  if (small && !lru_.empty()) lru_remove_locked(page_of(address));  // now shared with a pinned block
  stats_.allocated_bytes += nbytes;
  stats_.active_bytes += rounded;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_active_bytes = std::max(stats_.peak_active_bytes, stats_.active_bytes);
  stats_.num_allocs++;
  stats_.num_live_allocs++;
  return address;
}

bool AddressSpace::try_malloc_locked(uint64_t rounded, bool small, uintptr_t* out) {
  if (!small) {
    if (free_mapped_.take_best_fit(rounded, out)) return true;  // cached: no driver call
    return mapped_range_locked(rounded / page_bytes_, out);
  }
  uintptr_t block = 0;
  if (!small_free_.take_best_fit(rounded, &block)) {
    uintptr_t slab = 0;
    if (!free_mapped_.take_best_fit(page_bytes_, &slab) && !mapped_range_locked(1, &slab)) return false;
    slab_used_[slab] = 0;
    small_free_.insert(slab, page_bytes_);
    bool taken = small_free_.take_best_fit(rounded, &block);
    VTA_INVARIANT(taken);
  }
  uintptr_t slab = block - block % page_bytes_;
  slab_used_[slab] += rounded;
  if (slab == spare_slab_) spare_slab_ = 0;
  *out = block;
  return true;
}

bool AddressSpace::mapped_range_locked(size_t npages, uintptr_t* out) {
  size_t bytes = npages * page_bytes_;
  uintptr_t va = 0;
  if (!free_unmapped_.take_best_fit(bytes, &va)) {
    grow_va_locked(bytes);
    bool taken = free_unmapped_.take_best_fit(bytes, &va);
    VTA_INVARIANT(taken);
  }
  std::vector<int32_t> ids;
  ids.reserve(npages);
  auto give_back = [&] {
    for (int32_t id : ids) pages_.return_page(id);
    free_unmapped_.insert(va, bytes);
  };
  try {
    while (ids.size() < npages) {
      int32_t id = -1;
      if (!obtain_page_locked(&id)) {
        give_back();
        return false;
      }
      ids.push_back(id);
    }
    pages_.map_pages(va, ids);
  } catch (...) {
    give_back();
    throw;
  }
  *out = va;
  return true;
}

bool AddressSpace::obtain_page_locked(int32_t* id) {
  // Cheapest first: a free page, a cached one, memory freed but waiting for its stream, the
  // device pages that evicted pages still hold (after their streams' work), those of pages
  // whose eviction copy is still running (once it completed), and only then a copy of the
  // least recently used evictable page to host memory.
  for (;;) {
    if (pages_.acquire_page(id)) return true;
    if (reclaim_one_page_locked()) continue;
    if (pending_count_) {
      drain_pending_locked(true);
      continue;
    }
    if (release_evicted_locked()) continue;
    if (finish_evictions_locked()) continue;  // copies still running: their pages are next
    if (!evict_allowed_ || !evict_lru_locked()) return false;
  }
}

bool AddressSpace::reclaim_one_page_locked() {
  // Cached pages under free ranges first (smallest range: the least useful for reuse),
  // then the spare empty slab. Pages here were freed and their events completed.
  uintptr_t start = 0;
  size_t bytes = 0;
  uintptr_t victim = 0;
  if (free_mapped_.smallest(&start, &bytes)) {
    victim = start + bytes - page_bytes_;
    bool taken = free_mapped_.take_exact(victim, page_bytes_);
    VTA_INVARIANT(taken);
  } else if (spare_slab_) {
    victim = spare_slab_;
    bool taken = small_free_.take_exact(victim, page_bytes_);
    VTA_INVARIANT(taken);
    slab_used_.erase(victim);
    spare_slab_ = 0;
  } else {
    return false;
  }
  pages_.unmap_range(victim, page_bytes_);
  free_unmapped_.insert(victim, page_bytes_);
  stats_.num_page_reclaims++;
  return true;
}

void AddressSpace::grow_va_locked(size_t min_bytes) {
  size_t bytes = std::max<size_t>(reservation_bytes_, round_up(min_bytes, page_bytes_));
  uintptr_t va = pages_.reserve(bytes);
  for (RangeSet* set : {&free_mapped_, &free_unmapped_}) {
    set->add_fence(va);
    set->add_fence(va + bytes);
  }
  free_unmapped_.insert(va, bytes);
}

void AddressSpace::free(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  auto it = find_live_locked(address);
  const Allocation a = it->second;
  // Record the event before changing any state, so a driver failure loses nothing.
  EventHandle event = take_event_locked();
  Status s = backend_->event_record(event, a.stream);
  if (!s.is_ok()) {
    idle_events_.push_back(event);
    check(s);
  }
  live_.erase(it);
  if (a.evictable) evictable_bytes_ -= a.size;
  // Its pages may have become (un)evictable; with no evictable allocation left, none can be.
  if (a.evictable || evictable_bytes_) touch_range_locked(address, a.size);
  stats_.allocated_bytes -= a.requested;
  stats_.active_bytes -= a.size;
  stats_.num_frees++;
  stats_.num_live_allocs--;
  pending_[a.stream].push_back(PendingFree{address, a.size, a.small, event});
  ++pending_count_;
  stats_.pending_free_bytes += a.size;
  drain_pending_locked(false);
}

EventHandle AddressSpace::take_event_locked() {
  if (!idle_events_.empty()) {
    EventHandle e = idle_events_.back();
    idle_events_.pop_back();
    return e;
  }
  EventHandle e = 0;
  check(backend_->event_create(&e));
  all_events_.push_back(e);
  return e;
}

bool AddressSpace::event_done_locked(EventHandle event, bool wait) {
  if (wait) {
    check(backend_->event_synchronize(event));
    return true;
  }
  bool done = false;
  check(backend_->event_query(event, &done));
  return done;
}

std::vector<std::pair<uintptr_t, uint64_t>> AddressSpace::take_slab_blocks_locked(uintptr_t slab) {
  std::vector<std::pair<uintptr_t, uint64_t>> blocks;
  auto& ranges = small_free_.ranges();
  for (auto it = ranges.lower_bound(slab); it != ranges.end() && it->first < slab + page_bytes_; ++it)
    blocks.push_back(*it);
  for (auto& [a, n] : blocks) small_free_.take_exact(a, n);
  return blocks;
}

void AddressSpace::drain_pending_locked(bool wait) {
  if (!pending_count_) return;
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto& queue = it->second;
    while (!queue.empty()) {
      PendingFree p = queue.front();
      bool done = broken(VTA_DEBUG_BREAK_FREE_WAIT) || event_done_locked(p.event, wait);
      if (!done) break;  // later frees on this stream were recorded after it
      queue.pop_front();
      --pending_count_;
      ++pending_released_;
      stats_.pending_free_bytes -= p.size;
      give_event_locked(p.event);
      release_block_locked(p.address, p.size, p.small);
    }
    ++it;  // an emptied queue stays: streams are few, and a free per stream would re-create it
  }
}

void AddressSpace::release_large_range_locked(uintptr_t address, uint64_t size) {
  if (away_.empty()) {  // every page is resident: the whole range stays mapped (cached)
    free_mapped_.insert(address, size);
    return;
  }
  // Resident pages stay mapped (cached); evicted ones lose their copy and become unmapped VA.
  uintptr_t run = address;
  bool run_mapped = true;
  auto flush = [&](uintptr_t end) {
    if (end == run) return;
    (run_mapped ? free_mapped_ : free_unmapped_).insert(run, end - run);
    run = end;
  };
  for (uintptr_t va = address; va < address + size; va += page_bytes_) {
    if (away_.count(va)) drop_away_page_locked(va);  // may complete a restore: then resident
    bool mapped = pages_.page_at(va) >= 0;
    if (mapped != run_mapped) {
      flush(va);
      run_mapped = mapped;
    }
  }
  flush(address + size);
}

void AddressSpace::release_block_locked(uintptr_t address, uint64_t size, bool small) {
  if (!small) {
    release_large_range_locked(address, size);
    return;
  }
  uintptr_t slab = address - address % page_bytes_;
  uint64_t& used = slab_used_[slab];
  used -= size;
  if (away_.count(slab)) {
    // The slab page is evicted: its free blocks wait in the stash until it is restored.
    if (used != 0) {
      slab_stash_[slab].push_back({address, size});
      return;
    }
    drop_away_page_locked(slab);
    slab_stash_.erase(slab);
    slab_used_.erase(slab);
    if (pages_.page_at(slab) >= 0) {  // a restore completed while dropping
      free_mapped_.insert(slab, page_bytes_);
    } else {
      free_unmapped_.insert(slab, page_bytes_);
    }
    take_slab_blocks_locked(slab);  // small_free_ holds its blocks if a restore completed meanwhile
    return;
  }
  small_free_.insert(address, size);
  if (used != 0) return;
  if (spare_slab_ == 0) {
    spare_slab_ = slab;  // keep one empty slab: alloc/free of one small block stays cheap
    return;
  }
  bool taken = small_free_.take_exact(slab, page_bytes_);
  VTA_INVARIANT(taken);
  slab_used_.erase(slab);
  free_mapped_.insert(slab, page_bytes_);
}

[[noreturn]] void AddressSpace::throw_oom_locked(uint64_t requested, const char* why) {
  stats_.num_ooms++;
  uint64_t mapped = pages_.pages_mapped() * page_bytes_;
  std::string msg = "vtalloc out of memory: " + std::string(why ? why : "tried to allocate") + " " + mib(requested) +
                    " (" + std::to_string(requested) + " bytes); capacity " + mib(capacity_) + ", " +
                    mib(stats_.active_bytes) + " held by live allocations (" + mib(evictable_bytes_) +
                    " evictable), " + mib(mapped) + " mapped, " + mib(stats_.pending_free_bytes) +
                    " awaiting stream completion, host pool " + mib(host_pool_ ? host_pool_->used_bytes() : 0) +
                    " of " + mib(host_capacity_) + " used";
  throw OutOfMemory(msg, requested, capacity_, mapped);
}

[[noreturn]] void AddressSpace::throw_not_live_locked(uintptr_t address) {
  auto it = live_.upper_bound(address);
  if (it != live_.begin()) {
    --it;
    if (address > it->first && address < it->first + it->second.size)
      fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " is inside the allocation at " + hex(it->first) +
                                         " (an interior pointer), not the start of an allocation");
  }
  for (auto& [base, bytes] : pages_.reservations())
    if (address >= base && address < base + bytes)
      fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " is not a live allocation (already freed?)");
  fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " does not belong to this address space");
}

std::map<uintptr_t, AddressSpace::Allocation>::iterator AddressSpace::find_live_locked(uintptr_t address) {
  auto it = live_.find(address);
  if (it == live_.end()) throw_not_live_locked(address);
  return it;
}

uint64_t AddressSpace::size_of(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  return find_live_locked(address)->second.requested;
}

const AddressSpace::Allocation& AddressSpace::find_allocation_locked(uintptr_t address, uint64_t offset,
                                                                     uint64_t nbytes) {
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) throw_not_live_locked(address);
  --it;
  const Allocation& a = it->second;
  uint64_t into = address - it->first;
  if (address < it->first || into >= a.requested) throw_not_live_locked(address);
  uint64_t room = a.requested - into;
  if (offset > room || nbytes > room - offset)
    fail(VTA_ERR_INVALID_ARGUMENT, "access of " + std::to_string(nbytes) + " bytes at offset " + std::to_string(offset) +
                                       " runs past the end of the " + std::to_string(a.requested) +
                                       "-byte allocation at " + hex(it->first));
  return a;
}

void AddressSpace::write(uintptr_t address, uint64_t offset, const void* src, uint64_t nbytes) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  const Allocation& a = find_allocation_locked(address, offset, nbytes);
  if (nbytes == 0) return;
  copy_bytes_locked(address + offset, reinterpret_cast<uintptr_t>(src), nbytes, a.stream, true);
}

void AddressSpace::read(uintptr_t address, uint64_t offset, void* dst, uint64_t nbytes) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  const Allocation& a = find_allocation_locked(address, offset, nbytes);
  if (nbytes == 0) return;
  copy_bytes_locked(address + offset, reinterpret_cast<uintptr_t>(dst), nbytes, a.stream, false);
}

// Copy between [va, va + n) and host memory without restoring anything: resident pages,
// host-mapped evicted pages and restored pages not yet swapped in are reached at their
// address, copy-mode evicted ones in their host slot; in-flight pages are waited for first.
// A write to an evicted page whose device page is still held goes to both copies; a write to
// a restored page swaps it in first (the device copy would go stale otherwise).
void AddressSpace::copy_bytes_locked(uintptr_t va, uintptr_t host, uint64_t n, StreamHandle stream, bool to_va) {
  uintptr_t at = va;
  while (at < va + n) {
    uintptr_t page = page_of(at);
    uint64_t chunk = std::min<uint64_t>(page + page_bytes_, va + n) - at;
    uintptr_t target = at, also = 0;
    auto it = away_.find(page);
    if (it != away_.end()) {
      finish_inflight_locked(page, true);
      it = away_.find(page);
      if (it != away_.end() && to_va && it->second.state == Residency::restored) {
        swap_restored_locked();
        it = away_.find(page);
      }
      if (it != away_.end()) {
        const AwayPage& p = it->second;
        uintptr_t slot = p.slot.addr + (at - page);
        if (p.state == Residency::evicted && p.device_held) {
          if (to_va) also = slot;
        } else if (!p.host_mapped) {
          target = slot;
        }
      }
    }
    uintptr_t h = host + (at - va);
    check(to_va ? backend_->copy(target, h, chunk, stream) : backend_->copy(h, target, chunk, stream));
    if (also) check(backend_->copy(also, h, chunk, stream));
    at += chunk;
  }
  check(backend_->stream_synchronize(stream));
}

uint64_t AddressSpace::trim() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_pending_locked(true);
  drain_inflight_locked(false);
  release_evicted_locked();  // their device pages become free pages, released below
  if (spare_slab_) {
    bool taken = small_free_.take_exact(spare_slab_, page_bytes_);
    VTA_INVARIANT(taken);
    slab_used_.erase(spare_slab_);
    free_mapped_.insert(spare_slab_, page_bytes_);
    spare_slab_ = 0;
  }
  std::vector<std::pair<uintptr_t, size_t>> cached(free_mapped_.ranges().begin(), free_mapped_.ranges().end());
  for (auto& [start, bytes] : cached) {
    free_mapped_.take_exact(start, bytes);
    pages_.unmap_range(start, bytes);
    free_unmapped_.insert(start, bytes);
  }
  return pages_.release_free_pages();
}

void AddressSpace::import_page(int fd, uint64_t tag) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  if (!leased_) fail(VTA_ERR_INVALID_ARGUMENT, "import_page needs an address space created in leased mode");
  if (fd < 0) fail(VTA_ERR_INVALID_ARGUMENT, "import_page: invalid file descriptor");
  if ((pages_.pages_held() + 1) * page_bytes_ > capacity_)
    fail(VTA_ERR_INVALID_ARGUMENT, "import_page: the lease would exceed this space's capacity ceiling");
  PageHandle h = 0;
  check(backend_->import_page(fd, page_bytes_, &h));
  pages_.adopt_page(h, tag);
}

std::vector<uint64_t> AddressSpace::return_pages(uint64_t max_pages) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  if (!leased_) fail(VTA_ERR_INVALID_ARGUMENT, "return_pages needs an address space created in leased mode");
  drain_pending_locked(false);
  drain_inflight_locked(false);
  if (pages_.pages_unmapped() < max_pages) release_evicted_locked();
  while (pages_.pages_unmapped() < max_pages && reclaim_one_page_locked()) {
  }
  return pages_.give_back_pages(max_pages);
}

void AddressSpace::synchronize() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_pending_locked(true);
  drain_inflight_locked(true);
  // Every deferred mapping change happens now, after one wait for the streams involved.
  release_evicted_locked();
  swap_restored_locked();
}

void AddressSpace::close() {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return;
  closed_ = true;
  Status first_error;
  try {
    drain_pending_locked(true);
  } catch (const Error& e) {
    first_error = Status(e.code(), e.what());
  }
  try {
    release_eviction_locked();  // waits for in-flight copies: before the events go
  } catch (const Error& e) {
    if (first_error.is_ok()) first_error = Status(e.code(), e.what());
  }
  for (StreamHandle s : user_streams_) {  // test hooks: their kernels end before pages go
    (void)backend_->stream_synchronize(s);
    (void)backend_->stream_destroy(s);
  }
  user_streams_.clear();
  for (EventHandle e : all_events_) (void)backend_->event_destroy(e);
  all_events_.clear();
  idle_events_.clear();
  pending_.clear();
  pending_count_ = 0;
  live_.clear();
  try {
    pages_.release_all();
  } catch (const Error& e) {
    if (first_error.is_ok()) first_error = Status(e.code(), e.what());
  }
  free_mapped_.clear();
  free_unmapped_.clear();
  small_free_.clear();
  slab_used_.clear();
  backend_.reset();
  global_counters().live_spaces--;
  check(first_error);
}

vta_stats_t AddressSpace::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  vta_stats_t s = stats_;
  s.capacity_bytes = capacity_;
  s.page_bytes = page_bytes_;
  s.small_threshold_bytes = small_threshold_;
  s.mapped_bytes = pages_.pages_mapped() * page_bytes_;
  s.cached_bytes = free_mapped_.total_bytes() + (spare_slab_ ? page_bytes_ : 0);
  s.reserved_va_bytes = pages_.reserved_bytes();
  s.num_reservations = pages_.reservations().size();
  s.pages_total = pages_.pages_held();
  s.pages_mapped = pages_.pages_mapped();
  s.pages_free = pages_.pages_unmapped();
  s.peak_mapped_bytes = pages_.peak_pages_mapped() * page_bytes_;
  s.num_map_calls = pages_.num_map_calls();
  s.num_unmap_calls = pages_.num_unmap_calls();
  s.evict_mode = mapped_mode_ ? VTA_EVICT_MAPPED : VTA_EVICT_COPY;
  uint64_t evicted = 0, held = 0, restored = 0;
  for (auto& [va, p] : away_) {
    if (p.state == Residency::evicted) ++evicted;
    if (p.state == Residency::evicted && p.device_held) ++held;
    if (p.state == Residency::restored) ++restored;
  }
  s.pages_evicted = evicted;
  s.pages_in_flight = in_flight_ + restored;
  s.evicted_bytes = evicted * page_bytes_;
  s.evictable_bytes = evictable_bytes_;
  // Held device pages of evicted pages are mapped but hold no resident data of their own.
  s.pages_resident = pages_.pages_mapped() - free_mapped_.total_bytes() / page_bytes_ - (spare_slab_ ? 1 : 0) - held;
  s.host_pool_capacity_bytes = host_capacity_;
  s.host_pool_bytes = host_pool_ ? host_pool_->held_bytes() : 0;
  s.host_pool_used_bytes = host_pool_ ? host_pool_->used_bytes() : 0;
  return s;
}

void AddressSpace::reset_peak_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_active_bytes = stats_.active_bytes;
  pages_.reset_peak();
}

std::vector<vta_page_info_t> AddressSpace::pages() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  drain_inflight_locked(false);
  auto count_allocs = [&](uintptr_t va) {
    uint32_t n = 0;
    for_each_alloc_on_page_locked(va, [&](uintptr_t, const Allocation&) { ++n; });
    return n;
  };
  std::unordered_map<int32_t, uintptr_t> restoring;  // device page id -> the address it fills
  for (auto& [va, p] : away_)
    if ((p.state == Residency::restoring || p.state == Residency::restored) && p.device_page >= 0)
      restoring[p.device_page] = va;
  std::vector<vta_page_info_t> out;
  pages_.for_each_page([&](int32_t id, uintptr_t va) {
    vta_page_info_t info{};
    info.page_id = static_cast<uint64_t>(id);
    info.address = va;
    info.tag = pages_.tag_of(id);
    auto r = restoring.find(id);
    if (r != restoring.end()) {
      info.address = r->second;
      info.state = VTA_PAGE_IN_FLIGHT;
      info.num_allocs = count_allocs(r->second);
    } else if (va == 0) {
      info.state = VTA_PAGE_FREE;
    } else if (away_.count(va)) {
      // Being evicted, or evicted with its device page not yet released.
      info.state = away_.at(va).state == Residency::evicted ? VTA_PAGE_EVICTED : VTA_PAGE_IN_FLIGHT;
      info.num_allocs = count_allocs(va);
    } else {
      info.num_allocs = count_allocs(va);
      bool pending = false;
      for (auto& [stream, queue] : pending_)
        for (const PendingFree& p : queue) pending = pending || (p.address < va + page_bytes_ && p.address + p.size > va);
      auto slab = slab_used_.find(va);
      bool live_slab = slab != slab_used_.end() && slab->second > 0;
      info.state = (info.num_allocs > 0 || pending || live_slab) ? VTA_PAGE_ALLOCATED : VTA_PAGE_CACHED;
    }
    out.push_back(info);
  });
  for (auto& [va, p] : away_) {
    if (p.state != Residency::evicted || p.device_held) continue;  // the others were listed with their device page
    vta_page_info_t info{};
    info.page_id = VTA_NO_PAGE;
    info.address = va;
    info.state = VTA_PAGE_EVICTED;
    info.num_allocs = count_allocs(va);
    out.push_back(info);
  }
  return out;
}

std::vector<vta_alloc_info_t> AddressSpace::allocations() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  std::vector<vta_alloc_info_t> out;
  out.reserve(live_.size());
  for (auto& [addr, a] : live_) out.push_back(vta_alloc_info_t{addr, a.size, a.requested, a.stream});
  return out;
}

}  // namespace vta
