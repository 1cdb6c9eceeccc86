// Regions under enable(): the region tag of the calling thread's torch allocations, and pause,
// resume and the regions' rows over the shim's per-device spaces (torch_shim.h, "Regions").
//
// Owns: the thread-local tag (read by vta_torch_alloc and vta_torch_malloc, graph-private pools
// included) and those entry points.
// Invariants: the tag is per thread, like torch.cuda.use_mem_pool's routing; a thread that never
// set one allocates with none; every entry point runs in guarded() and creates no space.
#include <algorithm>
#include <cstring>
#include <vector>

#include "alloc/region_tags.hpp"
#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"

using vta::AddressSpace;

namespace vta::capi::torch {
namespace {

uint32_t& thread_region() {
  thread_local uint32_t region = 0;
  return region;
}

}  // namespace

uint32_t current_region() { return thread_region(); }

}  // namespace vta::capi::torch

using namespace vta::capi::torch;  // NOLINT(google-build-using-namespace): this file defines it
using vta::capi::guarded;
using vta::capi::need;

extern "C" {

vta_status_t vta_torch_set_region(uint32_t region, uint32_t* previous) {
  return guarded([&] {
    vta::check_region_tag(region, "set_region");
    if (previous) *previous = thread_region();
    thread_region() = region;
  });
}

vta_status_t vta_torch_region_pause(int32_t device, uint32_t region, uint32_t flags, uint64_t* out_page_bytes) {
  return guarded([&] {
    if (flags & ~uint32_t{VTA_PAUSE_DISCARD}) vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown pause flags");
    uint64_t moved = 0;
    for_devices(device, [&](int, AddressSpace& space) {
      moved += space.pause_region(region, (flags & VTA_PAUSE_DISCARD) != 0);
    });
    if (out_page_bytes) *out_page_bytes = moved;
  });
}

vta_status_t vta_torch_region_resume(int32_t device, uint32_t region, uint32_t flags, uint64_t* out_page_bytes) {
  return guarded([&] {
    if (flags & ~uint32_t{VTA_RESTORE_TRY}) vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown resume flags");
    uint64_t moved = 0;
    for_devices(device, [&](int, AddressSpace& space) {
      moved += space.resume_region(region, !(flags & VTA_RESTORE_TRY));
    });
    if (out_page_bytes) *out_page_bytes = moved;
  });
}

vta_status_t vta_torch_regions(int32_t device, vta_region_info_t* out, uint64_t capacity, uint64_t* out_count) {
  return guarded([&] {
    need(out_count, "count output");
    std::vector<vta_region_info_t> v;
    with_space(device, [&](AddressSpace& space) { v = space.region_infos(); });
    *out_count = v.size();
    if (out && capacity) std::memcpy(out, v.data(), sizeof(vta_region_info_t) * std::min<uint64_t>(capacity, v.size()));
  });
}

}  // extern "C"
