// Residency: a region's pages paused and resumed (see residency.hpp, "Regions").
//
// Owns: the transitions of paused away pages: resident -> paused (copied out as copy runs, or
// discarded; the device handle unmapped after one quiesce), an away page offloaded before
// joining a pause, and paused -> resident at the same address (a handle the space took, mapped a
// stretch of adjacent pages at a time, filled as copy runs, after one wait).
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
          if (joined.empty() || joined.back() != first) joined.push_back(first);
        },
        [&](int32_t id, uintptr_t h, uint64_t hb) {
          if (!leaving.empty() && leaving.back().va == h) return;  // the handle the previous allocation ended on
          if (users_.pausable(h, hb, region))
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
      check(backend_.unmap(va, bytes_of(p)));
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

bool Residency::next_paused(uintptr_t* cursor, uintptr_t end, uintptr_t* first, uint32_t* npages) {
  for (uintptr_t page = page_of(*cursor); page < end;) {
    uintptr_t va = away_.first_of(page);
    if (!va) {
      page += page_bytes_;
      continue;
    }
    AwayPage& q = away_.at(va);
    uintptr_t next = va + bytes_of(q);
    if (q.paused && q.device_held) {
      unpause_held(va);  // q is gone after this
    } else if (q.paused && q.device_page < 0) {
      *cursor = next;
      *first = va;
      *npages = q.npages;
      return true;
    }
    page = next;  // not paused (an offloaded page stays where it is), or it has its handle already
  }
  *cursor = end;
  return false;
}

void Residency::resume_page(uintptr_t first, int32_t id) {
  AwayPage* p = away_.find(first);
  VTA_INVARIANT(p && p->paused && p->state == State::evicted && !p->device_held && p->device_page < 0 &&
                pages_.pages_of(id) == p->npages);
  p->device_page = id;
}

void Residency::abandon_resume() {
  for (uintptr_t va : away_.where([](const AwayPage& p) { return p.paused && p.device_page >= 0; })) {
    AwayPage& p = away_.at(va);
    pages_.return_page(p.device_page);
    p.device_page = -1;
  }
}

uint64_t Residency::finish_resume() {
  auto vas = away_.where([](const AwayPage& p) { return p.paused && p.device_page >= 0; });
  if (vas.empty()) return 0;
  std::sort(vas.begin(), vas.end());
  std::vector<std::pair<uintptr_t, uint64_t>> mapped;  // stretches mapped so far
  size_t covered = 0;                                  // vas[0, covered) lie in them
  auto issued = Clock::now();
  try {
    while (covered < vas.size()) {
      size_t i = covered, j = i + 1;
      std::vector<int32_t> ids{away_.at(vas[i]).device_page};
      uint64_t bytes = bytes_of(away_.at(vas[i]));
      while (j < vas.size() && vas[j - 1] + bytes_of(away_.at(vas[j - 1])) == vas[j]) {
        ids.push_back(away_.at(vas[j]).device_page);
        bytes += bytes_of(away_.at(vas[j++]));
      }
      pages_.map_pages(vas[i], ids);  // one map per handle, one set-access for the stretch; all or nothing
      mapped.push_back({vas[i], bytes});
      covered = j;
    }
    CopyRuns runs(page_bytes_);
    for (uintptr_t va : vas)
      if (!away_.at(va).discarded) runs.add(va, away_.at(va).slots);
    order_.copy_runs(runs.runs(), false, {});
    check(order_.synchronize());
  } catch (...) {
    // The bytes are still in the host slots, and nothing was mapped at these addresses before, so
    // nothing can be using them: the stretches mapped are unmapped again (their handles free
    // handles), the handles not mapped yet go back, and every page stays paused.
    for (auto [va, bytes] : mapped) {
      try {
        pages_.unmap_range(va, bytes);
      } catch (...) {
      }
    }
    for (size_t k = 0; k < vas.size(); ++k) {
      AwayPage& p = away_.at(vas[k]);
      if (k >= covered) pages_.return_page(p.device_page);
      p.device_page = -1;
    }
    throw;
  }
  uint64_t pages = 0, copied = 0;
  for (uintptr_t va : vas) {
    AwayPage& p = away_.at(va);
    pages += p.npages;
    if (!p.discarded) copied += bytes_of(p);
    host_pool_.release(p.slots);
    paused_pages_ -= p.npages;
    finish_resident(va);
  }
  counters_.restored(static_cast<uint32_t>(pages), copied, issued);
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
