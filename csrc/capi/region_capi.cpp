// The C ABI of regions (vtalloc.h, "Regions"): region tags, tagged allocations, pause, resume and
// the rows of vta_regions.
//
// Owns: those entry points and the checks of their flags. Invariants: every entry point runs its
// body in guarded() (capi/guard.hpp): no exception crosses the boundary.
#include <algorithm>
#include <cstring>
#include <string>

#include "alloc/region_tags.hpp"
#include "capi/guard.hpp"
#include "capi/space_handle.hpp"
#include "vtalloc/vtalloc.h"

namespace {

using vta::capi::guarded;
using vta::capi::need;
using vta::capi::open_space;

}  // namespace

extern "C" {

vta_status_t vta_region_tag(const char* name, uint32_t* out_region) {
  return guarded([&] {
    need(out_region, "output");
    *out_region = vta::region_tag_id(name);
  });
}

vta_status_t vta_region_tag_name(uint32_t region, char* out, uint64_t out_len) {
  return guarded([&] {
    need(out, "output");
    vta::check_region_tag(region, "region tag name");
    std::string name = vta::region_tag_name(region);
    if (out_len <= name.size()) vta::fail(VTA_ERR_INVALID_ARGUMENT, "region tag name: the output is too short");
    std::memcpy(out, name.c_str(), name.size() + 1);
  });
}

vta_status_t vta_malloc_region(vta_space_t* space, uint64_t nbytes, uint64_t stream, uint32_t flags, uint32_t region,
                               uint64_t* out_address) {
  return guarded([&] {
    need(out_address, "output");
    if (flags & ~(VTA_MALLOC_NO_EVICT | VTA_MALLOC_TRY)) vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown vta_malloc_region flags");
    vta::check_region_tag(region, "malloc");
    *out_address =
        open_space(space).malloc(nbytes, stream, !(flags & VTA_MALLOC_NO_EVICT), !(flags & VTA_MALLOC_TRY), region);
  });
}

vta_status_t vta_region_pause(vta_space_t* space, uint32_t region, uint32_t flags, uint64_t* out_page_bytes) {
  return guarded([&] {
    if (flags & ~uint32_t{VTA_PAUSE_DISCARD}) vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown vta_region_pause flags");
    uint64_t n = open_space(space).pause_region(region, (flags & VTA_PAUSE_DISCARD) != 0);
    if (out_page_bytes) *out_page_bytes = n;
  });
}

vta_status_t vta_region_resume(vta_space_t* space, uint32_t region, uint32_t flags, uint64_t* out_page_bytes) {
  return guarded([&] {
    if (flags & ~uint32_t{VTA_RESTORE_TRY}) vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown vta_region_resume flags");
    uint64_t n = open_space(space).resume_region(region, !(flags & VTA_RESTORE_TRY));
    if (out_page_bytes) *out_page_bytes = n;
  });
}

vta_status_t vta_regions(vta_space_t* space, vta_region_info_t* out, uint64_t capacity, uint64_t* out_count) {
  return guarded([&] {
    need(out_count, "count output");
    auto v = open_space(space).region_infos();
    *out_count = v.size();
    if (out && capacity) std::memcpy(out, v.data(), sizeof(vta_region_info_t) * std::min<uint64_t>(capacity, v.size()));
  });
}

}  // extern "C"
