// Residency: a region's pages paused and resumed (see residency.hpp, "Regions").
//
// Owns: the transitions of paused away pages: resident -> paused (copied out as copy runs, or
// discarded; the device handle unmapped after one quiesce), an away page offloaded before
// joining a pause, and paused -> resident at the same address (a stretch of adjacent pages at a
// time, on the handles the space took for it, filled as copy runs, after one wait).
// Invariants: those of residency.hpp; a paused page has nothing mapped at its address, in either
// mode, until its resume maps a device handle there, and nothing but a resume restores it; a
// pause changes nothing before its copies completed (a host pool too small or a refused copy
// leaves every page resident with its bytes); a resume changes nothing before its copies
// completed (on an error its handles go back to the free handles and its pages stay paused).
#include <algorithm>
#include <string>

#include "evict/copy_runs.hpp"
#include "evict/residency.hpp"

namespace vta {

namespace {

// One handle leaving the device.
struct Leaving {
  uintptr_t va;
  int32_t id;
  uint32_t npages;
};

uint64_t overlap(uintptr_t a, uintptr_t a_end, uintptr_t b, uintptr_t b_end) {
  uintptr_t lo = std::max(a, b), hi = std::min(a_end, b_end);
  return hi > lo ? hi - lo : 0;
}

}  // namespace

Residency::PauseResult Residency::pause(const std::vector<std::pair<uintptr_t, uint64_t>>& spans, uint32_t region,
                                        bool discard, std::vector<int32_t>* freed) {
  PauseResult r;
  std::vector<Leaving> leaving;   // resident handles only the region holds, address order
  std::vector<uintptr_t> joined;  // away pages there already (offloaded before)
  for (auto [start, bytes] : spans) {
    for_each_handle_to_move(
        start, bytes,
        [&](uintptr_t first) {
          // Offloaded before: it joins the pause when only the region's blocks lie on it too.
          if ((joined.empty() || joined.back() != first) && facts_.pausable(first, bytes_of(away_.at(first)), region))
            joined.push_back(first);
        },
        [&](int32_t id, uintptr_t h, uint64_t hb) {
          if (!leaving.empty() && leaving.back().va == h) return;  // the handle the previous allocation ended on
          if (facts_.pausable(h, hb, region))
            leaving.push_back(Leaving{h, id, pages_.pages_of(id)});
          else
            r.kept_bytes += overlap(start, start + bytes, h, h + hb);
        });
  }

  // Host slots for every handle leaving, before anything moves: a copy-mode stretch of adjacent
  // handles gets one run of host memory (pieces if none is free), cut per handle.
  std::vector<HostPool::Slots> slots(leaving.size());
  auto give_back_slots = [&] {
    for (auto& s : slots) host_pool_.release(s);
  };
  if (!discard) {
    try {
      for (size_t i = 0; i < leaving.size();) {
        size_t j = i + 1;
        uint64_t npages = leaving[i].npages;
        while (!host_pool_.mapped() && j < leaving.size() &&
               leaving[j - 1].va + uint64_t{leaving[j - 1].npages} * page_bytes_ == leaving[j].va)
          npages += leaving[j++].npages;
        HostPool::Slots run;
        if (!host_pool_.acquire(static_cast<uint32_t>(npages), &run))
          fail(VTA_ERR_HOST_POOL_EXHAUSTED,
               "host pool exhausted pausing a region: it needs " + std::to_string(npages * page_bytes_) +
                   " more bytes, " + std::to_string(host_pool_.used_bytes()) + " of " +
                   std::to_string(host_pool_.capacity_bytes()) +
                   " bytes are used (raise host_capacity, or pause with discard=True)");
        std::vector<uint32_t> sizes;
        for (size_t k = i; k < j; ++k) sizes.push_back(leaving[k].npages);
        auto cut = CopyRuns::split(run, sizes, page_bytes_);
        for (size_t k = i; k < j; ++k) slots[k] = std::move(cut[k - i]);
        i = j;
      }
    } catch (...) {
      give_back_slots();
      throw;
    }
  }

  // The copies: after the last use of every page leaving, as copy runs, then one wait.
  auto issued = Clock::now();
  uint64_t leaving_pages = 0;
  if (!discard && !leaving.empty()) {
    CopyRuns runs(page_bytes_);
    std::vector<std::pair<uintptr_t, uint64_t>> after;
    for (size_t i = 0; i < leaving.size(); ++i) {
      runs.add(leaving[i].va, slots[i]);
      after.push_back({leaving[i].va, uint64_t{leaving[i].npages} * page_bytes_});
    }
    try {
      order_.copy_runs(runs.runs(), true, after);
      check(order_.synchronize());
    } catch (...) {
      give_back_slots();
      throw;
    }
  }
  for (size_t i = 0; i < leaving.size(); ++i) {
    AwayPage p;
    p.state = State::evicted;
    p.npages = leaving[i].npages;
    p.slots = std::move(slots[i]);
    p.device_held = true;  // released below, after one quiesce
    p.paused = true;
    p.discarded = discard;
    p.issued = issued;
    away_.add(leaving[i].va, p);
    victims_->forget_range(leaving[i].va, leaving[i].va + bytes_of(p));
    leaving_pages += p.npages;
    paused_pages_ += p.npages;
  }
  r.copied_bytes = discard ? 0 : leaving_pages * page_bytes_;
  if (leaving_pages) counters_.evicted(static_cast<uint32_t>(leaving_pages), r.copied_bytes, issued);

  // The mapping changes, after one wait for the streams that may touch any of these pages.
  std::vector<uintptr_t> unmapping;
  for (const Leaving& l : leaving) unmapping.push_back(l.va);
  for (uintptr_t va : joined) {
    AwayPage& p = away_.at(va);
    if (!p.paused) paused_pages_ += p.npages;
    p.paused = true;
    if (p.device_held || p.host_mapped) unmapping.push_back(va);
  }
  if (!unmapping.empty()) quiesce_pages(unmapping);
  for (uintptr_t va : unmapping) {
    AwayPage& p = away_.at(va);
    if (p.host_mapped) {  // mapped mode: its host copy showed at the address; a paused page shows nothing
      check(pages_.unmap_side(va, bytes_of(p)));
      p.host_mapped = false;
    }
    if (!p.device_held) continue;
    int32_t id = pages_.page_at(va);
    release_held_page(va, p);  // unmapped; a paused page gets no host copy mapped there
    freed->push_back(id);
    r.page_bytes += bytes_of(p);
  }
  if (discard)  // their host copies go: the bytes are dead
    for (uintptr_t va : joined) {
      AwayPage& p = away_.at(va);
      host_pool_.release(p.slots);
      p.slots.clear();
      p.discarded = true;
    }
  return r;
}

void Residency::unpause_held(uintptr_t va) {
  AwayPage& p = away_.at(va);
  paused_pages_ -= p.npages;
  p.paused = false;
  unevict_held(va);
}

std::vector<Residency::Stretch> Residency::paused_stretches(const std::vector<std::pair<uintptr_t, uint64_t>>& spans) {
  std::vector<uintptr_t> held, paused;  // first pages, address order (spans are)
  for (auto [start, bytes] : spans)
    for_each_away(start, bytes, [&](uintptr_t first, const AwayPage& p) {
      std::vector<uintptr_t>& list = p.device_held ? held : paused;
      if (p.paused && (list.empty() || list.back() != first)) list.push_back(first);
      return true;
    });
  for (uintptr_t va : held) unpause_held(va);  // never left the device (a pause that failed part-way)
  std::vector<Stretch> out;
  for (uintptr_t va : paused) {
    uint32_t n = away_.at(va).npages;
    if (!out.empty() && out.back().va + uint64_t{out.back().npages} * page_bytes_ == va)
      out.back().npages += n;
    else
      out.push_back(Stretch{va, n});
  }
  return out;
}

uint64_t Residency::resume(const std::vector<Stretch>& stretches, const std::vector<std::vector<int32_t>>& ids) {
  VTA_INVARIANT(ids.size() == stretches.size());
  size_t mapped = 0;  // stretches[0, mapped) are mapped
  auto issued = Clock::now();
  try {
    for (; mapped < stretches.size(); ++mapped) {
      uint64_t pages = 0;
      for (int32_t id : ids[mapped]) pages += pages_.pages_of(id);
      VTA_INVARIANT(pages == stretches[mapped].npages);
      pages_.map_pages(stretches[mapped].va, ids[mapped]);  // one map per handle, one set-access; all or nothing
    }
    CopyRuns runs(page_bytes_);
    for (const Stretch& st : stretches)
      for_each_away(st.va, uint64_t{st.npages} * page_bytes_, [&](uintptr_t first, const AwayPage& p) {
        if (!p.discarded) runs.add(first, p.slots);
        return true;
      });
    order_.copy_runs(runs.runs(), false, {});
    check(order_.synchronize());
  } catch (...) {
    // The bytes are still in the host slots, and nothing was mapped at these addresses before, so
    // nothing can be using them: the stretches mapped are unmapped again (their handles free
    // handles), the others' handles given back; every page stays paused.
    for (size_t k = 0; k < stretches.size(); ++k) {
      try {
        if (k < mapped)
          pages_.unmap_range(stretches[k].va, uint64_t{stretches[k].npages} * page_bytes_);
        else
          for (int32_t id : ids[k]) pages_.return_page(id);
      } catch (...) {
      }
    }
    throw;
  }
  uint64_t pages = 0, copied = 0;
  for (const Stretch& st : stretches) {
    std::vector<uintptr_t> firsts;
    for_each_away(st.va, uint64_t{st.npages} * page_bytes_, [&](uintptr_t first, const AwayPage&) {
      firsts.push_back(first);
      return true;
    });
    for (uintptr_t va : firsts) {
      AwayPage& p = away_.at(va);
      pages += p.npages;
      if (!p.discarded) copied += bytes_of(p);
      host_pool_.release(p.slots);
      paused_pages_ -= p.npages;
      finish_resident(va);
    }
  }
  if (pages) counters_.restored(static_cast<uint32_t>(pages), copied, issued);
  return pages * page_bytes_;
}

bool Residency::paused_over(uintptr_t start, uint64_t bytes) const {
  bool paused = false;
  if (paused_pages_)
    for_each_away(start, bytes, [&](uintptr_t, const AwayPage& p) { return !(paused = p.paused); });
  return paused;
}

void Residency::paused_bytes(uintptr_t start, uint64_t bytes, uint64_t* paused, uint64_t* discarded) const {
  *paused = *discarded = 0;
  if (!paused_pages_) return;
  for_each_away(start, bytes, [&](uintptr_t first, const AwayPage& p) {
    uint64_t n = p.paused ? overlap(start, start + bytes, first, first + bytes_of(p)) : 0;
    *paused += n;
    if (p.discarded) *discarded += n;
    return true;
  });
}

}  // namespace vta
