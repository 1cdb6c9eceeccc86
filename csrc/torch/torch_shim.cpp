// The PyTorch shim (torch_shim.h): the C ABI of torch's allocator over one space per device.
//
// Owns: the process-wide shim state (shim()), finding a device's space (existing_space, and
// space_for, which creates it with the limit set for it) and flushing the frees parked on it,
// and the entry points over the spaces: vta_torch_alloc (over torch_allocate, the body it shares
// with vta_torch_malloc: torch_allocate.cpp) / vta_torch_free, the devices, their
// stats, peaks, trim, offloaded pages and residency calls, and vta_torch_release, which closes
// every space and forgets the state. The options are torch_shim_options.cpp's, the failure
// records torch_shim_failures.cpp's, the C face of the out-of-memory exception
// torch_shim_oom.cpp's; the per-device spaces are space/device_spaces.hpp's, frees parked
// during CUDA graph capture capture_parking.hpp's, the last error guard.hpp's.
// Invariants: the state is immortal (never destroyed at exit: torch frees tensors during its
// own static destruction), so a space pointer, once published, stays valid for the life of the
// process; the calling thread's current context is the same after every call as before it (a
// backend that needs a context switches it: ContextGuard). What a backend can do (capture, a
// context) is asked of its capabilities, never of its kind.
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>

#include "backend/context_guard.hpp"
#include "torch/c10_oom.hpp"
#include "torch/capture_parking.hpp"
#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"
#include "blocks/text.hpp"

namespace vta::capi::torch {

using vta::AddressSpace;
using vta::ContextGuard;
using vta::DeviceSpaces;

static_assert(DeviceSpaces::kMaxDevices == VTA_TORCH_MAX_DEVICES, "one device range for the shim and its spaces");

Shim& shim() {
  static Shim* s = new Shim();  // immortal, see the file comment
  return *s;
}

// The space of a device, which must exist already (only vta_torch_alloc creates spaces).
AddressSpace& existing_space(int device, const std::string& why) {
  DeviceSpaces::check_device(device);
  AddressSpace* space = shim().spaces.get(device);
  if (!space) vta::fail(VTA_ERR_INVALID_ARGUMENT, why);
  return *space;
}

AddressSpace& space_for(int device) {
  Shim& s = shim();
  if (AddressSpace* space = s.spaces.get(device)) return *space;
  AddressSpace* space = s.spaces.get_or_create(device);
  if (uint64_t limit = s.limits[device].load(std::memory_order_acquire)) space->set_limit(limit);
  return *space;
}

// Free what was parked during a capture on `device`, once its stream no longer captures.
void flush_parked(int device, AddressSpace& space) {
  for (const std::string& error : shim().parking.flush(device, space)) record_free_failure(device, error);
}

}  // namespace vta::capi::torch

using namespace vta::capi::torch;  // NOLINT(google-build-using-namespace): this file defines it
using vta::capi::guarded;
using vta::capi::need;

extern "C" {

const char* vta_torch_last_error(void) { return vta::capi::last_error().c_str(); }

void* vta_torch_alloc(size_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // torch never frees a null pointer
  std::string message;
  bool oom = false;
  try {
    return reinterpret_cast<void*>(torch_allocate(size, device, stream, nullptr, TorchAbi::pluggable, &message));
  } catch (const vta::OutOfMemory&) {
    oom = true;  // recorded by torch_allocate, as every failure
  } catch (...) {
  }
  if (shim().on_failure.load(std::memory_order_acquire) == VTA_TORCH_FAIL_RETURN_NULL) return nullptr;
  // By design the one exception that leaves the shim: torch's global allocator has no other way
  // to fail, and its C++ callers turn it into a Python exception (see torch_shim.h).
  if (oom) vta::c10_oom::throw_oom(message);
  throw std::runtime_error(message);
}

void vta_torch_free(void* ptr, size_t /*size*/, int device, void* stream) {
  if (!ptr) return;
  try {
    AddressSpace& space = existing_space(device, "no vtalloc address space serves device " + std::to_string(device));
    ContextGuard guard(&space.backend_info());
    if (space.capabilities().can_capture) {
      if (vta::capi::stream_capturing(space.backend_kind(), stream)) {
        // Recording the free's event on a capturing stream would put it in the graph; free later.
        shim().parking.park(device, reinterpret_cast<uintptr_t>(ptr), stream);
        count_deferred_free(device);
        return;
      }
      flush_parked(device, space);
    }
    space.free(reinterpret_cast<uintptr_t>(ptr));
  } catch (const std::exception& e) {
    record_free_failure(device, std::string("vtalloc could not free a tensor's memory: ") + e.what());
  } catch (...) {
    record_free_failure(device, "vtalloc could not free a tensor's memory: unknown internal error");
  }
}

vta_status_t vta_torch_devices(uint64_t* mask) {
  return guarded([&] {
    need(mask, "output");
    *mask = shim().spaces.mask();
  });
}

vta_status_t vta_torch_stats(int32_t device, vta_stats_t* out) {
  return guarded([&] {
    need(out, "output");
    if (!with_space(device, [&](AddressSpace& space) { *out = space.stats(); })) {
      *out = vta_stats_t{};
      out->struct_size = sizeof *out;
    }
  });
}

vta_status_t vta_torch_reset_peak_stats(int32_t device) {
  return guarded([&] { for_devices(device, [](int, AddressSpace& space) { space.reset_peak_stats(); }); });
}

vta_status_t vta_torch_trim(int32_t device, uint64_t* out_released) {
  return guarded([&] {
    uint64_t released = 0;
    for_devices(device, [&](int, AddressSpace& space) { released += space.trim(); });
    if (out_released) *out_released = released;
  });
}

vta_status_t vta_torch_release_offloaded(int32_t device, uint32_t flags, uint64_t* out_released) {
  return guarded([&] {
    if (flags & ~uint32_t{VTA_RELEASE_WAIT}) vta::fail(VTA_ERR_INVALID_ARGUMENT, "release_offloaded: unknown flags");
    uint64_t released = 0;
    for_devices(device, [&](int, AddressSpace& space) {
      ContextGuard guard(&space.backend_info());
      released += space.release_offloaded(flags & VTA_RELEASE_WAIT);
    });
    if (out_released) *out_released = released;
  });
}

// Residency of the allocations behind torch's tensors (paged_activations on CUDA). The
// space must exist already: these calls never create one.
vta_status_t vta_torch_residency_op(int32_t device, int32_t op, uint64_t address, uint64_t stream,
                                    int32_t use_stream, int32_t* out) {
  return guarded([&] {
    AddressSpace& space = existing_space(device, "no vtalloc address space serves this device yet");
    ContextGuard guard(&space.backend_info());
    const uint64_t* consumer = use_stream ? &stream : nullptr;
    if ((op == VTA_TORCH_OP_OFFLOAD || op == VTA_TORCH_OP_SET_EVICTABLE) && shim().pools.in_used_pool(device, address))
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "the block at " + vta::hex(address) +
                                              " belongs to a graph-private pool that still has users: a captured "
                                              "graph may use it at any replay, so it cannot be offloaded");
    switch (op) {
      case VTA_TORCH_OP_SET_EVICTABLE: space.set_evictable(address, true); break;
      case VTA_TORCH_OP_CLEAR_EVICTABLE: space.set_evictable(address, false); break;
      case VTA_TORCH_OP_OFFLOAD: space.offload(address); break;
      case VTA_TORCH_OP_PREFETCH: space.prefetch(address, consumer); break;
      case VTA_TORCH_OP_ENSURE_RESIDENT: space.ensure_resident(address, consumer); break;
      case VTA_TORCH_OP_RESIDENCY:
        need(out, "output");
        *out = space.residency(address);
        break;
      default: vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown residency operation " + std::to_string(op));
    }
  });
}

vta_status_t vta_torch_offload_bytes(int32_t device, uint64_t address, uint64_t* moved) {
  return guarded([&] {
    need(moved, "output");
    AddressSpace& space = existing_space(device, "no vtalloc address space serves this device yet");
    ContextGuard guard(&space.backend_info());
    if (shim().pools.in_used_pool(device, address))
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "the block at " + vta::hex(address) +
                                              " belongs to a graph-private pool that still has users: a captured "
                                              "graph may use it at any replay, so it cannot be offloaded");
    *moved = space.offload(address);
  });
}

vta_status_t vta_torch_release(void) {
  return guarded([&] {
    Shim& s = shim();
    std::lock_guard<std::mutex> lk(s.mu);
    ContextGuard guard(s.spaces.any() ? s.backend.load(std::memory_order_acquire) : nullptr);
    vta::Status closed = s.spaces.release(
        "vtalloc's torch allocator", [&](int d) { return s.parking.parked(d) + s.pools.cached_count(d); },
        default_config().space);
    s.pools.clear();
    for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
      s.limits[d].store(0, std::memory_order_release);
      std::lock_guard<std::mutex> mlk(s.accumulated[d].mu);
      s.accumulated[d].marks = vta_torch_device_stats_t{};
    }
    forget_failures();
    forget_options_locked(s);
    vta::check(closed);
  });
}

}  // extern "C"
