// The torch-native C ABI (torch_native.h): what a binding implementing PyTorch's full
// CUDAAllocator calls, over the same per-device spaces as the pluggable shim.
//
// Owns: the entry points of torch_native.h but its statistics (torch_native_stats.cpp): the
// allocation (over torch_allocate, the body it shares with vta_torch_alloc: torch_allocate.cpp)
// and free by pointer, the lookups by address, record_stream, the largest allocatable block, the
// per-device limit and the graph-private pools' calls.
// Invariants: no call throws, calls Python or creates a space except vta_torch_malloc; an
// allocation fails and is recorded as vta_torch_alloc's (one body: torch_allocate); a free on a
// capturing stream is parked, as vta_torch_free's is; the calling thread's context and
// stream-capture mode are the same after every call as before it (RAII guards); what a backend
// can do (capture, a context) is asked of its capabilities, never of its kind.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "blocks/text.hpp"
#include "backend/context_guard.hpp"
#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"

using namespace vta::capi::torch;  // NOLINT(google-build-using-namespace)
using vta::AddressSpace;
using vta::ContextGuard;
using vta::DeviceSpaces;
using vta::capi::guarded;
using vta::capi::need;
using vta::capi::PrivatePools;

namespace {

// The device whose space holds `ptr` in one of its reservations; -1 if none.
int device_holding(uintptr_t ptr) {
  for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
    AddressSpace* space = shim().spaces.get(d);
    if (space && space->holds_address(ptr)) return d;
  }
  return -1;
}

int device_of_or_fail(uintptr_t ptr) {
  int d = device_holding(ptr);
  if (d < 0) vta::fail(VTA_ERR_INVALID_ARGUMENT, "address " + vta::hex(ptr) + " is not in any vtalloc device space");
  return d;
}

// Free `ptr` of `device`: to its pool while the pool has users, else parked on a capturing stream, else to the space.
void free_on(int device, AddressSpace& space, uintptr_t ptr) {
  if (space.capabilities().can_capture) flush_parked(device, space);
  // A block of a pool with users goes back to its pool even during a capture: that records no
  // event (a recorded stream's mark waits for the capture's end), and the capture may reuse it
  // on the same stream, in stream order, as PyTorch's private pools do.
  if (shim().pools.in_used_pool(device, ptr) && shim().pools.free(device, ptr, space)) return;
  uintptr_t base = 0;
  vta::Allocation a{};
  if (space.capabilities().can_capture && space.containing(ptr, &base, &a) && base == ptr &&
      vta::capi::stream_capturing(space.backend_kind(), reinterpret_cast<void*>(a.stream))) {
    shim().parking.park(device, ptr, reinterpret_cast<void*>(a.stream));
    count_deferred_free(device);
    return;
  }
  if (!shim().pools.free(device, ptr, space)) space.free(ptr);
}

}  // namespace

extern "C" {

int32_t vta_torch_native_abi(void) { return VTA_TORCH_NATIVE_ABI; }

vta_status_t vta_torch_malloc(uint64_t size, int32_t device, void* stream, const vta_torch_pool_id_t* pool,
                              void** out) {
  return guarded([&] {
    need(out, "output");
    *out = nullptr;
    std::string failure;  // recorded by torch_allocate; the status and last error come from what it rethrows
    *out = reinterpret_cast<void*>(torch_allocate(size, device, stream, pool, TorchAbi::native, &failure));
  });
}

vta_status_t vta_torch_free_ptr(void* ptr, int32_t* device_out) {
  int device = -1;
  vta_status_t st = guarded([&] {
    need(ptr, "pointer");
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    device = device_of_or_fail(p);
    if (device_out) *device_out = device;
    AddressSpace& space = existing_space(device, "no vtalloc address space serves device " + std::to_string(device));
    ContextGuard guard(&space.backend_info());
    free_on(device, space, p);
  });
  if (st != VTA_OK)
    record_free_failure(device < 0 ? 0 : device,
                        std::string("vtalloc could not free a tensor's memory: ") + vta_torch_last_error());
  return st;
}

vta_status_t vta_torch_device_of(void* ptr, int32_t* device) {
  return guarded([&] {
    need(device, "output");
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    int d = device_of_or_fail(p);
    uintptr_t base = 0;
    vta::Allocation a{};
    if (!shim().spaces.get(d)->containing(p, &base, &a) || base != p)
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "address " + vta::hex(p) + " is not the start of a live block");
    *device = d;
  });
}

vta_status_t vta_torch_base_allocation(void* ptr, void** base, uint64_t* size) {
  return guarded([&] {
    need(base, "output");
    need(size, "output");
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    int d = device_of_or_fail(p);
    uintptr_t start = 0;
    vta::Allocation a{};
    if (!shim().spaces.get(d)->containing(p, &start, &a))
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "address " + vta::hex(p) + " is inside no live block");
    *base = reinterpret_cast<void*>(start);
    *size = a.requested;
  });
}

vta_status_t vta_torch_record_stream(void* ptr, void* stream) {
  return guarded([&] {
    uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    AddressSpace& space = *shim().spaces.get(device_of_or_fail(p));
    ContextGuard guard(&space.backend_info());
    space.record_stream(p, reinterpret_cast<vta::StreamHandle>(stream));
  });
}

vta_status_t vta_torch_largest_allocatable(int32_t device, uint64_t* bytes) {
  return guarded([&] {
    need(bytes, "output");
    *bytes = 0;
    with_space(device, [&](AddressSpace& space) { *bytes = space.largest_allocatable(); });
  });
}

vta_status_t vta_torch_set_limit(int32_t device, uint64_t bytes) {
  return guarded([&] {
    DeviceSpaces::check_device(device);
    AddressSpace* space = shim().spaces.get(device);
    if (space) {
      ContextGuard guard(&space->backend_info());
      space->set_limit(bytes);
    }
    shim().limits[device].store(bytes, std::memory_order_release);
  });
}

vta_status_t vta_torch_get_limit(int32_t device, uint64_t* limit_out) {
  return guarded([&] {
    need(limit_out, "output");
    DeviceSpaces::check_device(device);
    AddressSpace* space = shim().spaces.get(device);
    *limit_out = space ? space->limit() : shim().limits[device].load(std::memory_order_acquire);
  });
}

vta_status_t vta_torch_pool_incref(int32_t device, vta_torch_pool_id_t pool) {
  return guarded([&] {
    DeviceSpaces::check_device(device);
    shim().pools.incref(device, pool_key(pool));
  });
}

vta_status_t vta_torch_pool_release(int32_t device, vta_torch_pool_id_t pool) {
  return guarded([&] {
    DeviceSpaces::check_device(device);
    AddressSpace* space = shim().spaces.get(device);
    ContextGuard guard(space ? &space->backend_info() : nullptr);
    shim().pools.release(device, pool_key(pool), space);
  });
}

vta_status_t vta_torch_pool_use_count(int32_t device, vta_torch_pool_id_t pool, int32_t* out) {
  return guarded([&] {
    need(out, "output");
    DeviceSpaces::check_device(device);
    *out = shim().pools.use_count(device, pool_key(pool));
  });
}

vta_status_t vta_torch_pool_empty(int32_t device, vta_torch_pool_id_t pool, uint64_t* released) {
  return guarded([&] {
    DeviceSpaces::check_device(device);
    uint64_t n = shim().pools.empty(device, pool_key(pool));
    if (released) *released = n;
  });
}

vta_status_t vta_torch_blocks(int32_t device, const vta_torch_pool_id_t* pool, vta_torch_block_t* out,
                              uint64_t capacity, uint64_t* count) {
  return guarded([&] {
    need(count, "output");
    if (capacity) need(out, "output");
    DeviceSpaces::check_device(device);
    AddressSpace* space = shim().spaces.get(device);
    std::vector<vta_torch_block_t> blocks;
    if (space) {
      ContextGuard guard(&space->backend_info());
      PrivatePools::Id only = pool ? pool_key(*pool) : PrivatePools::Id{};
      for (auto& [address, a] : space->records()) {
        PrivatePools::Id id{};
        PrivatePools::Block b{};
        bool owned = shim().pools.owner(device, address, &id, &b);
        if (pool && (!owned || id != only)) continue;
        vta_torch_block_t t{};
        t.address = address;
        t.size = a.size;
        t.requested = a.kept ? b.requested : a.requested;
        t.stream = a.stream;
        t.pool = vta_torch_pool_id_t{id.first, id.second};
        t.state = a.kept ? VTA_TORCH_BLOCK_POOL_CACHED : VTA_TORCH_BLOCK_LIVE;
        t.small = a.small ? 1 : 0;
        blocks.push_back(t);
      }
    }
    *count = blocks.size();
    if (capacity) std::memcpy(out, blocks.data(), std::min<uint64_t>(capacity, blocks.size()) * sizeof *out);
  });
}

vta_status_t vta_torch_pool_set_live(int32_t device, vta_torch_pool_id_t pool, const uint64_t* live, uint64_t n,
                                     uint64_t* freed, uint64_t freed_capacity, uint64_t* n_freed, uint64_t* allocated,
                                     uint64_t allocated_capacity, uint64_t* n_allocated) {
  return guarded([&] {
    need(n_freed, "output");
    need(n_allocated, "output");
    if (n) need(live, "live addresses");
    DeviceSpaces::check_device(device);
    PrivatePools::Id id = pool_key(pool);
    AddressSpace* space = shim().spaces.get(device);
    if (!space) {  // no block yet: only an empty list fits
      if (shim().pools.use_count(device, id) == 0)
        vta::fail(VTA_ERR_INVALID_ARGUMENT, "no graph-private pool with users has this id on this device");
      if (n) vta::fail(VTA_ERR_INVALID_ARGUMENT, "set_live: the pool has no blocks");
      *n_freed = *n_allocated = 0;
      return;
    }
    ContextGuard guard(&space->backend_info());
    uint64_t blocks = 0;
    shim().pools.for_each_block(device, &id, [&](uintptr_t, const PrivatePools::Block&, PrivatePools::Id) { ++blocks; });
    if (freed_capacity < blocks || allocated_capacity < blocks || (blocks && (!freed || !allocated)))
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "set_live: the output arrays must hold the pool's " + std::to_string(blocks) +
                                              " blocks each");
    std::vector<uint64_t> f, a;
    shim().pools.set_live(device, id, *space, std::vector<uint64_t>(live, live + n), &f, &a);
    std::copy(f.begin(), f.end(), freed);
    std::copy(a.begin(), a.end(), allocated);
    *n_freed = f.size();
    *n_allocated = a.size();
  });
}

}  // extern "C"
