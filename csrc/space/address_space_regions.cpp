// AddressSpace entry points of regions: pause and resume the allocations that carry one tag,
// and list what each region holds (docs/regions.md; the engine's part is
// csrc/evict/residency_pause.cpp).
//
// Owns: the order of a pause's and a resume's steps and "need a page" for a resume (the policy's
// sources, then the engine's free_device_page, then extent splits, as a restore takes them); what
// becomes of the handles a pause unmapped (released to the driver, or, in a leased space, kept
// unmapped for the page source to give back); the refusal of entry points that would touch a
// paused allocation.
// Invariants: those of address_space.hpp; a resume that fails (no device page, a driver error)
// gives back every handle it took and leaves the region paused (ResumeUndo, then the engine); a
// pause's handles are released only after the engine unmapped them.
#include <chrono>
#include <string>

#include "alloc/region_tags.hpp"
#include "blocks/text.hpp"
#include "space/address_space.hpp"

namespace vta {
namespace {

// A resume that an error ends before the engine owns its handles gives them back: the region
// stays paused.
class ResumeUndo {
 public:
  ResumeUndo(PageTable& pages, std::vector<std::vector<int32_t>>& ids) : pages_(pages), ids_(ids) {}
  ~ResumeUndo() {
    if (done_) return;
    for (auto& run : ids_)
      for (int32_t id : run) {
        try {
          pages_.return_page(id);
        } catch (...) {
          // The error that ended the resume is the one reported.
        }
      }
  }
  ResumeUndo(const ResumeUndo&) = delete;
  ResumeUndo& operator=(const ResumeUndo&) = delete;
  void done() { done_ = true; }

 private:
  PageTable& pages_;
  std::vector<std::vector<int32_t>>& ids_;
  bool done_ = false;
};

uint32_t checked_region(uint32_t region, const char* what) {
  check_region_tag(region, what);
  if (region == 0) fail(VTA_ERR_INVALID_ARGUMENT, std::string(what) + ": region 0 is no region (tag one first)");
  return region;
}

}  // namespace

void AddressSpace::check_not_paused_locked(uintptr_t start, uint64_t bytes, const char* what) const {
  if (!residency_.paused_over(start, bytes)) return;
  uint32_t region = 0;
  policy_.live().for_each_in(start, bytes, [&](uintptr_t, const Allocation& a) { region = region ? region : a.region; });
  fail(VTA_ERR_PAUSED, std::string(what) + " of the allocation at " + hex(start) + ": it belongs to region '" +
                           region_tag_name(region) + "', which is paused: resume the region first");
}

std::vector<std::pair<uintptr_t, uint64_t>> AddressSpace::settled_region_locked(uint32_t region, const char* what) {
  check_open_locked();
  residency_.drain_inflight(false);
  auto spans = Regions::spans(policy_.live(), region);
  // The waits of a pause or a resume (events on the allocations' streams) would join a graph being
  // captured on one of them, and its mapping changes would land under the capture: refused.
  if (capabilities_.can_capture) {
    std::vector<StreamHandle> streams;
    for (auto [start, bytes] : spans) policy_.facts().add_live_streams(start, bytes, &streams);
    for (StreamHandle st : streams) {
      bool capturing = false;
      (void)Backend::stream_is_capturing(backend_kind_, st, &capturing);  // false when it cannot be asked
      if (capturing)
        fail(VTA_ERR_INVALID_ARGUMENT, std::string(what) + " of region '" + region_tag_name(region) +
                                           "' while a stream of its allocations captures a CUDA graph: "
                                           "pause and resume outside the capture");
    }
  }
  return spans;
}

uint64_t AddressSpace::pause_region(uint32_t region, bool discard) {
  checked_region(region, "pause");
  auto t0 = Regions::Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  auto spans = settled_region_locked(region, "pause");
  std::vector<int32_t> freed;
  Residency::PauseResult r = residency_.pause(spans, region, discard, &freed);
  // The device memory goes back to the driver (another process, or another allocator, may use
  // it now); a leased space's pages are the service's: they stay unmapped here until the page
  // source gives them back.
  if (!leased_)
    for (int32_t id : freed) pages_.release_free(id);
  regions_.paused(region, r.page_bytes, t0);
  return r.page_bytes;
}

uint64_t AddressSpace::resume_region(uint32_t region, bool count_oom) {
  checked_region(region, "resume");
  auto t0 = Regions::Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  auto stretches = residency_.paused_stretches(settled_region_locked(region, "resume"));
  uint64_t wanted = 0;  // page bytes to bring back: an out-of-memory's numbers
  for (const auto& st : stretches) wanted += uint64_t{st.npages} * page_bytes_;
  std::vector<std::vector<int32_t>> ids(stretches.size());
  ResumeUndo undo(pages_, ids);
  // "Need a page", as for a restore: the policy's sources, the engine's (nothing of this region is
  // resident and away, so there is nothing to keep), then extent splits. Each stretch gets the
  // handles a new block covering it would (extents where it is long enough); a size the driver
  // refuses falls back to one-page handles.
  auto take = [&](uint32_t npages, std::vector<int32_t>* out) -> bool {
    int32_t id = -1;
    for (AllocPolicy::Take t; (t = policy_.take_handle(npages, &id)) != AllocPolicy::Take::taken;) {
      if (t == AllocPolicy::Take::refused) return false;
      if (!residency_.free_device_page(true, 0, 0) && !policy_.split_extents_for_pages(npages, 0))
        policy_.throw_oom(wanted, "resuming a paused region needs", count_oom);
    }
    out->push_back(id);
    return true;
  };
  for (size_t i = 0; i < stretches.size(); ++i)
    for (uint32_t n : policy_.plan_handles(stretches[i].npages))
      if (!take(n, &ids[i]))
        for (uint32_t k = 0; k < n; ++k)
          if (!take(1, &ids[i])) policy_.throw_oom(wanted, "resuming a paused region needs", count_oom);
  undo.done();  // the engine's from here: it gives them back itself if it fails
  uint64_t back = residency_.resume(stretches, ids);
  regions_.resumed(region, back, t0);
  return back;
}

std::vector<vta_region_info_t> AddressSpace::region_infos() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  residency_.drain_inflight(false);
  return regions_.infos(policy_.live(), residency_);
}

}  // namespace vta
