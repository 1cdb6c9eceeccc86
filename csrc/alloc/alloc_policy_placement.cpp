// AllocPolicy: where a block goes.
//
// Owns: the good fits taken before any event is recorded (a pending free of the request's own
// stream, a free range over mapped pages), the best fit over the free space and its rules
// (nothing away under a block, no idle extent covered less than half, off the handles evictable
// allocations and blocks of other regions hold), the fewest-pages place when the best fit cannot get its pages, and the
// mapping of what is missing under a new block (runs of unmapped pages, their handle plans), in
// steps that end where a handle only the eviction engine could free is wanted (needs_page).
// Invariants: those of alloc_policy.hpp; a placement taken from the free space and not mapped
// goes back to it (give_free) before the policy tries another or fails, and an abandoned one
// too; at every step's end the placement holds exactly its range, its runs mapped so far and the
// handles taken for the current run, so nothing is lost whichever step an error ends.
#include <algorithm>
#include <utility>

#include "alloc/alloc_policy.hpp"

namespace vta {

bool AllocPolicy::take_same_stream(const Request& r, StreamHandle stream, uintptr_t* out) {
  // The same size only: pending frees are not merged with their neighbours until they are
  // released, so cutting a request out of a larger one scatters blocks (and the pages they hold)
  // that the free space would have packed; a training loop's next step asks for the same sizes.
  // Not over a page that is away (it returns through the eviction engine), nor where a block in
  // the free space may not go (blocked_until).
  auto usable = [&](uintptr_t address, uint64_t bytes) { return blocked_until(address, bytes, Fit::any) == 0; };
  return pending_.take(stream, r.rounded, r.rounded, usable, out);
}

bool AllocPolicy::take_mapped(uint64_t rounded, uintptr_t* out) {
  uintptr_t a = take_free(rounded, Fit::mapped);
  if (!a) return false;
  *out = a;
  return true;
}

uintptr_t AllocPolicy::take_fewest(uint64_t bytes) {
  uintptr_t best = 0;
  find_fewest(bytes, &best);
  if (!best) return take_free(bytes, Fit::fresh);
  free_.take_exact(best, bytes);
  refresh_cached(best, best + bytes);
  return best;
}

uint64_t AllocPolicy::find_fewest(uint64_t bytes, uintptr_t* at_out) const {
  uint64_t fresh_cost = (bytes + page_bytes_ - 1) / page_bytes_;
  uintptr_t best = 0;
  uint64_t best_cost = UINT64_MAX;
  size_t looked = 0;
  free_.for_each_fitting(bytes, [&](uintptr_t start, uint64_t size) {
    // Against its left neighbour, against its right one, or on a page boundary.
    for (uintptr_t at : {start, start + size - bytes, round_up(start, page_bytes_)}) {
      if (at + bytes > start + size || blocked_until(at, bytes, Fit::any)) continue;
      uint64_t cost = pages_taken(at, bytes);
      if (cost < best_cost) {
        best = at;
        best_cost = cost;
      }
    }
    return ++looked < kFewestLooks && best_cost + 2 > fresh_cost;  // sharing saves two pages at most
  });
  bool fresh = !best || best_cost > fresh_cost;
  *at_out = fresh ? 0 : best;
  return fresh ? fresh_cost : best_cost;
}

uint64_t AllocPolicy::pages_taken(uintptr_t at, uint64_t bytes) const {
  uint64_t n = 0;
  for (uintptr_t va = page_of(at); va < at + bytes;) {
    int32_t id = pages_.page_at(va);
    if (id < 0) {
      n++;
      va += page_bytes_;
      continue;
    }
    if (is_cached(id)) n += pages_.pages_of(id);
    va = pages_.address_of(id) + pages_.bytes_of(id);
  }
  return n;
}

uintptr_t AllocPolicy::take_free(uint64_t bytes, Fit fit) {
  auto placement = [&](uintptr_t start, size_t size) { return place(start, size, bytes, fit); };
  uintptr_t a = 0;
  if (fit == Fit::mapped) {
    // A good fit only (at most twice the request): any other placement waits for the frees still
    // pending to join the free space (settle), so that the best fit is chosen among all of it.
    if (!free_.take(bytes, placement, &a, 2 * bytes)) return 0;
  } else if (!free_.take(bytes, placement, &a)) {
    free_.grow(bytes + (fit == Fit::fresh ? page_bytes_ : 0));
    bool taken = free_.take(bytes, placement, &a);  // the new reservation is free and unmapped
    VTA_INVARIANT(taken);
  }
  refresh_cached(a, a + bytes);  // the handles under it are no longer cached
  return a;
}

void AllocPolicy::give_free(uintptr_t a, uint64_t bytes) {
  free_.give(a, bytes);
  refresh_cached(a, a + bytes);
}

uintptr_t AllocPolicy::place(uintptr_t start, uint64_t size, uint64_t bytes, Fit fit) const {
  uintptr_t at = fit == Fit::fresh ? round_up(start, page_bytes_) : start;
  while (at + bytes <= start + size) {
    uintptr_t next = blocked_until(at, bytes, fit);
    if (!next) return at;
    at = fit == Fit::fresh ? round_up(next, page_bytes_) : next;
  }
  return 0;
}

uintptr_t AllocPolicy::blocked_until(uintptr_t at, uint64_t bytes, Fit fit) const {
  uintptr_t end = at + bytes;
  if (port_->any_away())
    for (uintptr_t va = page_of(at); va < end; va += page_bytes_) {
      uintptr_t first = 0;
      uint64_t span = 0;
      if (port_->away_span(va, &first, &span)) return first + span;
    }
  bool evictable = live_.evictable_bytes() != 0, regions = live_.tagged() != 0 || region_ != 0;
  if (evictable || regions) {
    // Not on a handle an evictable allocation holds (a page, or an extent, at either end of the
    // block): a handle moves whole, so it would stay resident, with the evictable bytes on it, as
    // long as the new block lives (saved activations being paged out behind the forward pass).
    // Nor on one a block of another region (or of none) holds: a paused region's handles move
    // whole too, so sharing one would keep it on the device (or pause another's bytes).
    for (uintptr_t edge : {at, end - 1}) {
      int32_t id = pages_.page_at(edge);
      uintptr_t h = id >= 0 ? pages_.address_of(id) : page_of(edge);
      uint64_t hb = id >= 0 ? pages_.bytes_of(id) : page_bytes_;
      if (at <= h && h + hb <= end) continue;  // the block covers it whole
      bool held = false;
      live_.for_each_in(h, hb, [&](uintptr_t, const Allocation& a) {
        held = held || (evictable && a.evictable) || (regions && a.region != region_);
      });
      if (held) return h + hb;
    }
  }
  if (fit != Fit::any) {  // fresh: nothing mapped under it; mapped: every page mapped
    for (uintptr_t va = page_of(at); va < end;) {
      int32_t id = pages_.page_at(va);
      if (fit == Fit::fresh && id >= 0) return pages_.address_of(id) + pages_.bytes_of(id);
      if (fit == Fit::mapped && id < 0) return va + page_bytes_;
      va = id >= 0 ? pages_.address_of(id) + pages_.bytes_of(id) : va + page_bytes_;
    }
    if (fit == Fit::fresh) return 0;
  }
  // A cached extent under it (mapped, no block on it): the block must cover at least half of its
  // pages (a page it touches counts), or it would keep the rest mapped for nothing.
  uintptr_t next = 0;
  pages_.for_each_mapped_extent_in(at, end, [&](int32_t id, uintptr_t h) {
    uint64_t hb = pages_.bytes_of(id);
    if (next || !free_.is_free(h, hb)) return;
    uintptr_t lo = std::max(at, h), hi = std::min(end, h + hb);
    uint64_t covered = (round_up(hi, page_bytes_) - page_of(lo)) / page_bytes_;
    if (2 * covered < pages_.pages_of(id)) next = h + hb;
  });
  return next;
}

std::vector<uint32_t> AllocPolicy::handle_plan(size_t npages, bool partial_first, bool partial_last) const {
  // A page shared with a neighbour is a one-page handle: the extents lie under this block only.
  size_t head = partial_first ? 1 : 0, tail = partial_last && npages > head ? 1 : 0;
  size_t whole = npages - head - tail;
  std::vector<uint32_t> plan(head, 1);
  if (!extent_max_pages_ || whole < extent_min_pages_) {
    plan.insert(plan.end(), whole, 1);
  } else {
    // Size classes extent_max_pages_, half of it, a quarter ... down to two pages, largest
    // first, and one page for what is left: few handles, and of a few sizes only, so a freed
    // extent fits the next block of a size that covers most of it (docs/eviction.md).
    size_t left = whole;
    for (uint64_t c = extent_max_pages_; c >= 2; c /= 2)
      while (left >= c) {
        plan.push_back(static_cast<uint32_t>(c));
        left -= c;
      }
    plan.insert(plan.end(), left, 1);
  }
  plan.insert(plan.end(), tail, 1);
  return plan;
}

void AllocPolicy::hold_fit(Placement& p, uintptr_t at) {
  p.at_ = at;
  p.runs_.clear();
  p.run_ = 0;
  // The runs of unmapped pages under the block, in address order.
  uintptr_t end = at + p.request_.rounded;
  for (uintptr_t va = page_of(at); va < end;) {
    int32_t id = pages_.page_at(va);
    if (id >= 0) {
      va = pages_.address_of(id) + pages_.bytes_of(id);
      continue;
    }
    if (!p.runs_.empty() && p.runs_.back().first + p.runs_.back().second * page_bytes_ == va)
      p.runs_.back().second++;
    else
      p.runs_.emplace_back(va, 1);
    va += page_bytes_;
  }
  if (!p.runs_.empty()) plan_run(p, false);  // none: every page is mapped already, no driver call
}

void AllocPolicy::plan_run(Placement& p, bool one_page) {
  auto [va, n] = p.runs_[p.run_];
  bool partial_first = va < p.at_, partial_last = va + n * page_bytes_ > p.at_ + p.request_.rounded;
  p.plan_ = one_page ? std::vector<uint32_t>(n, 1) : handle_plan(n, partial_first, partial_last);
  p.one_page_ = one_page;
  p.ids_.clear();
}

AllocPolicy::Mapping AllocPolicy::map_runs(Placement& p) {
  while (p.run_ < p.runs_.size()) {
    while (p.ids_.size() < p.plan_.size()) {
      uint32_t n = p.plan_[p.ids_.size()];
      int32_t id = -1;
      Take t = take_handle(n, &id);
      if (t == Take::taken) {
        p.ids_.push_back(id);
        continue;
      }
      if (t == Take::spent) {  // only the eviction engine can free a page now: the space asks it
        p.wanted_ = n;
        return Mapping::needs_page;
      }
      if (!run_failed(p, true)) {  // refused, one-page handles already
        drop_fit(p);
        return Mapping::dropped;
      }
    }
    pages_.map_pages(p.runs_[p.run_].first, p.ids_);  // all or nothing: on a throw the handles are still taken
    p.ids_.clear();
    if (++p.run_ < p.runs_.size()) plan_run(p, false);
  }
  return Mapping::mapped;
}

bool AllocPolicy::run_failed(Placement& p, bool refused) {
  for (int32_t id : p.ids_) pages_.return_page(id);
  p.ids_.clear();
  if (!refused || p.one_page_) return false;
  plan_run(p, true);  // the driver refused an extent's size although capacity was there
  return true;
}

void AllocPolicy::drop_fit(Placement& p) {
  auto give_range = [&] {
    uintptr_t at = p.at_;
    p.at_ = 0;
    p.runs_.clear();
    give_free(at, p.request_.rounded);
  };
  // Never twice: should the driver refuse an unmap, the runs still mapped stay under the free
  // range given back, as cached handles.
  size_t mapped = p.run_;
  p.run_ = 0;
  try {
    for (size_t i = 0; i < mapped; ++i) pages_.unmap_range(p.runs_[i].first, p.runs_[i].second * page_bytes_);
  } catch (...) {
    give_range();
    throw;
  }
  give_range();
}

void AllocPolicy::abandon(Placement& p) {
  for (int32_t id : p.ids_) pages_.return_page(id);
  p.ids_.clear();
  if (p.at_) drop_fit(p);
}

}  // namespace vta
