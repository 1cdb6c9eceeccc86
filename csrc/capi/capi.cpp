// The C ABI (vtalloc.h) over AddressSpace.
//
// Owns: the vta_space entry points of vtalloc.h but the test ones (vta_debug_*: capi/testing/,
// which production code never includes). Invariants: no exception crosses this
// boundary: every entry point runs its body through `guarded()` (capi/guard.hpp, which also
// holds the one thread-local last error of the whole C ABI), turning an Error (or anything
// else) into a status code and a message.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "space/address_space.hpp"
#include "capi/guard.hpp"
#include "capi/space_handle.hpp"
#include "backend/counters.hpp"
#include "vtalloc/vtalloc.h"


namespace {

using vta::capi::guarded;
using vta::capi::need;

using vta::capi::open_space;

}  // namespace

extern "C" {

int32_t vta_abi_version(void) { return VTA_ABI_VERSION; }

const char* vta_last_error(void) { return vta::capi::last_error().c_str(); }

void vta_last_oom(uint64_t* requested, uint64_t* capacity, uint64_t* mapped) {
  const uint64_t* oom = vta::capi::last_oom();
  if (requested) *requested = oom[0];
  if (capacity) *capacity = oom[1];
  if (mapped) *mapped = oom[2];
}

vta_status_t vta_global_counters(vta_global_counters_t* out) {
  return guarded([&] {
    need(out, "output");
    auto& g = vta::global_counters();
    vta_global_counters_t c{};
    c.struct_size = sizeof c;
    c.live_spaces = static_cast<uint64_t>(g.live_spaces.load());
    c.live_pages = static_cast<uint64_t>(g.live_pages.load());
    c.live_page_bytes = static_cast<uint64_t>(g.live_page_bytes.load());
    c.live_reservations = static_cast<uint64_t>(g.live_reservations.load());
    c.reserved_va_bytes = static_cast<uint64_t>(g.reserved_va_bytes.load());
    c.live_mappings = static_cast<uint64_t>(g.live_mappings.load());
    c.pinned_host_bytes = static_cast<uint64_t>(g.pinned_host_bytes.load());
    c.live_events = static_cast<uint64_t>(g.live_events.load());
    c.live_streams = static_cast<uint64_t>(g.live_streams.load());
    *out = c;
  });
}

vta_status_t vta_backend_probe(int32_t backend, int32_t device) {
  return guarded([&] {
    vta::BackendOptions opts;
    opts.kind = backend;
    opts.device = device;
    std::unique_ptr<vta::Backend> b;
    vta::check(vta::make_backend(opts, &b));
  });
}

vta_status_t vta_space_create(const vta_config_t* config, vta_space_t** out) {
  return guarded([&] {
    need(config, "config");
    need(out, "output");
    auto impl = vta::AddressSpace::create(*config);
    *out = new vta_space{std::move(impl)};
  });
}

vta_status_t vta_space_close(vta_space_t* space) {
  return guarded([&] {
    need(space, "address space handle");
    if (!space->impl || space->forked()) return;  // idempotent; in a forked child the parent's: nothing
    space->impl->close();
  });
}

void vta_space_destroy(vta_space_t* space) {
  if (!space) return;
  try {
    if (space->forked()) (void)space->impl.release();  // the parent's: leaked in the child, never torn down
    delete space;  // ~AddressSpace closes if needed
  } catch (...) {
  }
}

vta_status_t vta_space_backend(vta_space_t* space, int32_t* backend, int32_t* device) {
  return guarded([&] {
    auto& s = open_space(space);
    if (backend) *backend = s.backend_kind();
    if (device) *device = s.device();
  });
}

vta_status_t vta_space_modeled_ns(vta_space_t* space, int32_t* enabled, uint64_t* modeled_ns) {
  return guarded([&] {
    need(enabled, "output");
    need(modeled_ns, "output");
    *enabled = open_space(space).modeled_ns(modeled_ns) ? 1 : 0;
  });
}

vta_status_t vta_malloc(vta_space_t* space, uint64_t nbytes, uint64_t stream, uint64_t* out_address) {
  return guarded([&] {
    need(out_address, "output");
    *out_address = open_space(space).malloc(nbytes, stream);
  });
}

vta_status_t vta_malloc_ex(vta_space_t* space, uint64_t nbytes, uint64_t stream, uint32_t flags, uint64_t* out_address) {
  return guarded([&] {
    need(out_address, "output");
    if (flags & ~(VTA_MALLOC_NO_EVICT | VTA_MALLOC_TRY)) vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown vta_malloc_ex flags");
    *out_address = open_space(space).malloc(nbytes, stream, !(flags & VTA_MALLOC_NO_EVICT), !(flags & VTA_MALLOC_TRY));
  });
}

vta_status_t vta_free(vta_space_t* space, uint64_t address) {
  return guarded([&] { open_space(space).free(address); });
}

vta_status_t vta_record_stream(vta_space_t* space, uint64_t address, uint64_t stream) {
  return guarded([&] { open_space(space).record_stream(address, static_cast<vta::StreamHandle>(stream)); });
}

vta_status_t vta_size_of(vta_space_t* space, uint64_t address, uint64_t* out) {
  return guarded([&] {
    need(out, "output");
    *out = open_space(space).size_of(address);
  });
}

vta_status_t vta_write(vta_space_t* space, uint64_t address, uint64_t offset, const void* src, uint64_t nbytes) {
  return guarded([&] {
    if (nbytes) need(src, "source buffer");
    open_space(space).write(address, offset, src, nbytes);
  });
}

vta_status_t vta_read(vta_space_t* space, uint64_t address, uint64_t offset, void* dst, uint64_t nbytes) {
  return guarded([&] {
    if (nbytes) need(dst, "destination buffer");
    open_space(space).read(address, offset, dst, nbytes);
  });
}

vta_status_t vta_trim(vta_space_t* space, uint64_t* out_released) {
  return guarded([&] {
    uint64_t r = open_space(space).trim();
    if (out_released) *out_released = r;
  });
}

vta_status_t vta_release_offloaded(vta_space_t* space, uint32_t flags, uint64_t* out_released) {
  return guarded([&] {
    if (flags & ~uint32_t{VTA_RELEASE_WAIT}) vta::fail(VTA_ERR_INVALID_ARGUMENT, "release_offloaded: unknown flags");
    uint64_t r = open_space(space).release_offloaded(flags & VTA_RELEASE_WAIT);
    if (out_released) *out_released = r;
  });
}

vta_status_t vta_synchronize(vta_space_t* space) {
  return guarded([&] { open_space(space).synchronize(); });
}

vta_status_t vta_stats(vta_space_t* space, vta_stats_t* out) {
  return guarded([&] {
    need(out, "output");
    *out = open_space(space).stats();
  });
}

vta_status_t vta_reset_peak_stats(vta_space_t* space) {
  return guarded([&] { open_space(space).reset_peak_stats(); });
}

vta_status_t vta_pages(vta_space_t* space, vta_page_info_t* out, uint64_t capacity, uint64_t* out_count) {
  return guarded([&] {
    need(out_count, "count output");
    auto v = open_space(space).pages();
    *out_count = v.size();
    if (out && capacity) std::memcpy(out, v.data(), sizeof(vta_page_info_t) * std::min<uint64_t>(capacity, v.size()));
  });
}

vta_status_t vta_allocations(vta_space_t* space, vta_alloc_info_t* out, uint64_t capacity, uint64_t* out_count) {
  return guarded([&] {
    need(out_count, "count output");
    auto v = open_space(space).allocations();
    *out_count = v.size();
    if (out && capacity) std::memcpy(out, v.data(), sizeof(vta_alloc_info_t) * std::min<uint64_t>(capacity, v.size()));
  });
}

vta_status_t vta_set_evictable(vta_space_t* space, uint64_t address, int32_t evictable) {
  return guarded([&] { open_space(space).set_evictable(address, evictable != 0); });
}

vta_status_t vta_offload(vta_space_t* space, uint64_t address) {
  return guarded([&] { open_space(space).offload(address); });
}

vta_status_t vta_offload_bytes(vta_space_t* space, uint64_t address, uint64_t* moved) {
  return guarded([&] {
    need(moved, "output");
    *moved = open_space(space).offload(address);
  });
}

vta_status_t vta_restore(vta_space_t* space, uint64_t address, uint64_t stream, int32_t use_stream, uint32_t flags) {
  return guarded([&] {
    if (flags & ~(VTA_RESTORE_WAIT | VTA_RESTORE_TRY)) vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown vta_restore flags");
    vta::AddressSpace& s = open_space(space);
    const uint64_t* consumer = use_stream ? &stream : nullptr;
    if (flags & VTA_RESTORE_WAIT)
      s.ensure_resident(address, consumer, !(flags & VTA_RESTORE_TRY));
    else
      s.prefetch(address, consumer, !(flags & VTA_RESTORE_TRY));
  });
}

// The restore entry's aliases (vtalloc.h): one call each, so they cannot drift from it.
vta_status_t vta_prefetch(vta_space_t* space, uint64_t address, uint64_t stream, int32_t use_stream) {
  return vta_restore(space, address, stream, use_stream, 0);
}

vta_status_t vta_ensure_resident(vta_space_t* space, uint64_t address, uint64_t stream, int32_t use_stream) {
  return vta_restore(space, address, stream, use_stream, VTA_RESTORE_WAIT);
}

vta_status_t vta_residency(vta_space_t* space, uint64_t address, int32_t* out) {
  return guarded([&] {
    need(out, "output");
    *out = open_space(space).residency(address);
  });
}

}  // extern "C"
