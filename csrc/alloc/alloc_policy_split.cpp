// AllocPolicy: splitting the extents that blocks use only in part, at the edge of an OOM.
//
// Owns: the last step before an out-of-memory (alloc_policy.hpp, step 4): which extents are split
// and in what order, and the driver work of one split. The driver maps and releases a handle
// whole, so an extent stays held while any block touches any of its pages; a split gives the
// touched pages handles of their own at the same virtual addresses, copies their bytes there and
// releases the extent, whose untouched pages then back the request.
//
// Order: only when the request (or a restore's handle) finds no room otherwise, and only when
// splitting every extent that may be split would make room for it (else nothing changes and the
// OOM is raised as before); extents whose touched pages fit the room left come first (each split
// frees room for the next), the most pages freed per driver call first, and it stops as soon as
// the request fits. An extent whose touched pages fit no room is staged through host memory.
//
// Invariants: addresses never change (invariant 2); the mapping under a block changes only after
// a host wait for all work on the device (invariant 4): unlike a free block's, a live block's
// users are not known (a tensor may be read on any stream; record_stream is only asked for at
// its free), so a split waits for every stream, not only the blocks' own; mapped pages never
// exceed capacity: in place, the new handles fit under capacity beside the extent, whose second
// mapping (the copy's source) is an alias of the same physical handle, not a page; a failure at
// any step before the extent is released puts the extent back under its blocks, their bytes in
// it, and propagates a typed error. An extent with an away page, a kept block (a graph pool's: a
// replay may touch it on any stream) or a stream capturing a graph is never split. The victim
// policy's candidates are kept by virtual page, so a new handle under a page needs no word to
// the eviction engine.
#include <algorithm>
#include <string>
#include <utility>

#include "alloc/alloc_policy.hpp"
#include "blocks/text.hpp"

namespace vta {
namespace {

// Pinned host memory of a staged split, given back whatever happens.
class HostStaging {
 public:
  HostStaging(Backend& backend, uint64_t bytes) : backend_(backend), bytes_(bytes) {
    check(backend_.host_alloc_pinned(bytes_, &ptr_));
  }
  ~HostStaging() { (void)backend_.host_free_pinned(ptr_, bytes_); }
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  uintptr_t at(uint64_t offset) const { return reinterpret_cast<uintptr_t>(ptr_) + offset; }

 private:
  Backend& backend_;
  uint64_t bytes_;
  void* ptr_ = nullptr;
};

}  // namespace

uint64_t AllocPolicy::room_pages() const {
  uint64_t cached = std::min(cached_.pages(), pages_.pages_mapped());
  uint64_t used = pages_.pages_held() - pages_.pages_unmapped() - cached;
  uint64_t cap = pages_.capacity_pages();
  return used >= cap ? 0 : cap - used;
}

std::vector<StreamHandle> AllocPolicy::streams_over(uintptr_t va, uint64_t bytes) const {
  std::vector<StreamHandle> streams;
  facts_.add_live_streams(va, bytes, &streams);
  std::vector<uintptr_t> vas;
  for (uintptr_t p = va; p < va + bytes; p += page_bytes_) vas.push_back(p);
  facts_.add_freed_streams(vas, &streams);
  return streams;
}

bool AllocPolicy::quiesce() {
  if (skip_quiesce_) return true;  // VTA_DEBUG_BREAK_QUIESCE: tests show the stress run catches it
  return backend_.device_synchronize().is_ok();
}

bool AllocPolicy::split_plan(int32_t id, uintptr_t va, Split* s) const {
  if (pages_.address_of(id) != va || pages_.pages_of(id) < 2) return false;
  uint64_t bytes = pages_.bytes_of(id);
  if (port_->any_away() && port_->is_away(va)) return false;  // an extent's pages are away together
  s->id = id;
  s->va = va;
  s->npages = pages_.pages_of(id);
  s->touched = 0;
  s->runs.clear();
  for (uintptr_t p = va; p < va + bytes; p += page_bytes_) {
    if (free_.is_free(p, page_bytes_)) continue;
    s->touched++;
    if (!s->runs.empty() && s->runs.back().first + uint64_t{s->runs.back().second} * page_bytes_ == p)
      s->runs.back().second++;
    else
      s->runs.emplace_back(p, 1);
  }
  if (s->touched == 0 || s->touched == s->npages) return false;  // cached (reclaimed as it is), or all used
  bool kept = false;
  live_.for_each_in(va, bytes, [&](uintptr_t, const Allocation& a) { kept = kept || a.kept; });
  if (kept) return false;
  std::vector<StreamHandle> streams = streams_over(va, bytes);
  for (StreamHandle st : streams) {
    bool capturing = false;
    (void)Backend::stream_is_capturing(backend_.kind(), st, &capturing);  // false when it cannot be asked
    if (capturing) return false;
  }
  // Driver calls: a create and a map per new handle, a set-access and a copy per run, the alias
  // (map, set-access, unmap), the extent's unmap and release, the device's wait, and a record
  // and a wait for the copies.
  uint64_t handles = 0;
  for (auto& run : s->runs) handles += handle_plan(run.second, true, true).size();
  s->calls = 2 * handles + 2 * s->runs.size() + 8;
  return true;
}

bool AllocPolicy::split_extents_for_bytes(uint64_t bytes, StreamHandle stream) {
  uintptr_t at = 0;
  return split_extents((bytes + page_bytes_ - 1) / page_bytes_, stream,
                       [&](uint64_t room) { return find_fewest(bytes, &at) <= room; });
}

bool AllocPolicy::split_extents_for_pages(uint64_t npages, StreamHandle stream) {
  return split_extents(npages, stream, [&](uint64_t room) { return npages <= room; });
}

template <typename Fits>
bool AllocPolicy::split_extents(uint64_t most, StreamHandle stream, Fits&& fits) {
  if (!extent_max_pages_ || !pages_.extents_held() || fits(room_pages())) return false;
  // The device wait a split needs would become part of a graph being captured (or be refused).
  bool capturing = false;
  (void)Backend::stream_is_capturing(backend_.kind(), stream, &capturing);  // false when it cannot be asked
  if (capturing) return false;
  std::vector<int32_t> failed;  // extents a split gave up on (the driver had no handle): not again
  bool any = false, first = true;
  for (;;) {
    uint64_t room = room_pages();
    if (fits(room)) return any;
    // The extents as they are now: a split (its handles taken, its copies waited for) may have
    // let frees complete and changed what blocks touch.
    std::vector<Split> plans;
    uint64_t freed = 0;
    pages_.for_each_mapped_extent([&](int32_t id, uintptr_t va) {
      Split s;
      if (std::find(failed.begin(), failed.end(), id) != failed.end() || !split_plan(id, va, &s)) return;
      freed += s.npages - s.touched;
      plans.push_back(std::move(s));
    });
    if (plans.empty()) return any;
    if (first && room + freed < most) return false;  // no use: change nothing, the OOM says why
    first = false;
    // In place where the touched pages fit the room, the most pages freed per driver call first;
    // staged through host memory only when none fits (a staged split frees the most room).
    auto better = [&](const Split& a, const Split& b) {
      bool fa = a.touched <= room, fb = b.touched <= room;
      if (fa != fb) return fa;
      return (a.npages - a.touched) * b.calls > (b.npages - b.touched) * a.calls;
    };
    const Split& s = *std::min_element(plans.begin(), plans.end(), better);
    // Nothing has changed yet: a device that cannot be waited for (a graph captured elsewhere in
    // the process) leaves the OOM to be raised.
    if (!quiesce()) return any;
    bool done = s.touched <= room ? split_in_place(s) : split_staged(s);
    if (!done) failed.push_back(s.id);
    any = any || done;
  }
}

bool AllocPolicy::take_split_handles(const Split& s, std::vector<std::vector<int32_t>>* ids) {
  ids->assign(s.runs.size(), {});
  try {
    for (size_t r = 0; r < s.runs.size(); ++r) {
      std::vector<uint32_t> plan = handle_plan(s.runs[r].second, true, true);
      for (size_t i = 0; i < plan.size();) {
        int32_t id = -1;
        Take t = take_handle(plan[i], &id);
        if (t == Take::refused) {  // the driver refused that extent's size: one-page handles for it
          uint32_t n = plan[i];
          plan.erase(plan.begin() + static_cast<std::ptrdiff_t>(i));
          plan.insert(plan.begin() + static_cast<std::ptrdiff_t>(i), n, 1u);
          continue;
        }
        if (t == Take::spent) {
          give_back_handles(ids);
          return false;
        }
        (*ids)[r].push_back(id);
        ++i;
      }
    }
  } catch (...) {
    give_back_handles(ids);
    throw;
  }
  return true;
}

void AllocPolicy::give_back_handles(std::vector<std::vector<int32_t>>* ids) {
  for (auto& run : *ids)
    for (int32_t id : run) pages_.return_page(id);
  ids->clear();
}

bool AllocPolicy::split_in_place(const Split& s) {
  std::vector<std::vector<int32_t>> ids;
  if (!take_split_handles(s, &ids)) return false;
  Split now;  // taking handles may have let frees complete: split what blocks touch now
  if (!split_plan(s.id, s.va, &now) || now.runs != s.runs) {
    give_back_handles(&ids);
    return split_plan(s.id, s.va, &now) && now.touched < s.touched && split_in_place(now);
  }
  uint64_t bytes = pages_.bytes_of(s.id);
  uintptr_t window = 0;
  size_t mapped_runs = 0;
  bool aliased = false, moved = false, copying = false;
  try {
    // The copy's source: the extent mapped a second time, in free virtual space with nothing
    // mapped under it (the same physical handle: no page more under capacity).
    window = take_free(bytes, Fit::fresh);
    pages_.map_alias(window, s.id);
    aliased = true;
    pages_.unmap_taken(s.id);
    moved = true;
    for (; mapped_runs < s.runs.size(); ++mapped_runs) pages_.map_pages(s.runs[mapped_runs].first, ids[mapped_runs]);
    copying = true;
    for (auto& [va, n] : s.runs) check(backend_.copy(va, window + (va - s.va), uint64_t{n} * page_bytes_, 0));
    events_.record_then_sync(0);
    copying = false;
  } catch (...) {
    // Back as it was: the extent under its blocks, their bytes in it (nothing was written to it).
    if (copying) (void)backend_.stream_synchronize(0);
    unmap_split_handles(&ids, mapped_runs);
    bool back = !moved || map_back(s.va, s.id);
    if (aliased) pages_.unmap_alias(window, s.id);
    if (window) give_free(window, bytes);
    if (!back) {
      pages_.return_page(s.id);
      fail(VTA_ERR_DRIVER, "splitting the extent at " + hex(s.va) +
                               " failed and the driver refused to map it back: the blocks on it lost their pages");
    }
    throw;
  }
  pages_.unmap_alias(window, s.id);
  give_free(window, bytes);
  release_split_extent(s.id);
  num_extent_splits_++;
  extent_split_pages_ += s.touched;
  return true;
}

void AllocPolicy::unmap_split_handles(std::vector<std::vector<int32_t>>* ids, size_t mapped_runs) {
  for (size_t r = 0; r < mapped_runs && r < ids->size(); ++r)
    for (int32_t id : (*ids)[r]) pages_.unmap_taken(id);
  give_back_handles(ids);
}

void AllocPolicy::release_split_extent(int32_t id) {
  try {
    pages_.release_taken(id);  // its untouched pages are room under capacity now
  } catch (...) {
    // The blocks have moved: the split stands. The extent stays a free handle, released when
    // room is wanted (release_free_for), where a refusal is reported.
    pages_.return_page(id);
  }
}

bool AllocPolicy::map_back(uintptr_t va, int32_t id) {
  try {
    pages_.map_pages(va, {id});
    return true;
  } catch (...) {
    return false;  // all or nothing: the handle is still taken and unmapped
  }
}

bool AllocPolicy::split_staged(const Split& s) {
  uint64_t bytes = pages_.bytes_of(s.id);
  HostStaging host(backend_, uint64_t{s.touched} * page_bytes_);
  // Where each run's bytes wait: packed, in address order.
  std::vector<uint64_t> offset(s.runs.size(), 0);
  for (size_t r = 1; r < s.runs.size(); ++r) offset[r] = offset[r - 1] + uint64_t{s.runs[r - 1].second} * page_bytes_;
  auto copy_runs = [&](bool to_host) {
    try {
      for (size_t r = 0; r < s.runs.size(); ++r) {
        uintptr_t va = s.runs[r].first;
        uint64_t n = uint64_t{s.runs[r].second} * page_bytes_;
        check(to_host ? backend_.copy(host.at(offset[r]), va, n, 0) : backend_.copy(va, host.at(offset[r]), n, 0));
      }
      events_.record_then_sync(0);
    } catch (...) {
      (void)backend_.stream_synchronize(0);  // no copy still runs under memory about to change
      throw;
    }
  };
  auto lost = [&] {
    fail(VTA_ERR_DRIVER, "splitting the extent at " + hex(s.va) +
                             " failed and the driver refused to map its bytes back: the blocks on it lost their pages");
  };
  copy_runs(true);  // a failure here changed nothing
  pages_.unmap_taken(s.id);
  try {
    pages_.release_taken(s.id);
  } catch (...) {
    if (!map_back(s.va, s.id)) lost();  // refused: still held, the bytes in it
    throw;
  }
  // From here until they are under their addresses again the bytes are in host memory only:
  // the touched pages get their handles, or failing that an extent of the size just released.
  auto put_back = [&] {
    int32_t id = -1;
    try {
      if (take_handle(s.npages, &id) != Take::taken) lost();
      pages_.map_pages(s.va, {id});
      copy_runs(false);
    } catch (...) {
      if (id >= 0 && pages_.address_of(id) == s.va) pages_.unmap_range(s.va, bytes);
      else if (id >= 0) pages_.return_page(id);
      lost();
    }
  };
  std::vector<std::vector<int32_t>> ids;
  size_t mapped_runs = 0;
  bool split = false;
  try {
    if (take_split_handles(s, &ids)) {
      for (; mapped_runs < s.runs.size(); ++mapped_runs) pages_.map_pages(s.runs[mapped_runs].first, ids[mapped_runs]);
      copy_runs(false);
      split = true;
    }
  } catch (...) {
    unmap_split_handles(&ids, mapped_runs);
    put_back();
    throw;
  }
  if (!split) {
    put_back();
    return false;
  }
  num_extent_splits_++;
  num_extent_splits_staged_++;
  extent_split_pages_ += s.touched;
  return true;
}

}  // namespace vta
