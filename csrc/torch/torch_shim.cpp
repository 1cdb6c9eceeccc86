// The PyTorch shim (torch_shim.h): the C ABI of torch's allocator over one space per device.
//
// Owns: the process-wide shim state (the torch options and their normalization, the failure
// records of each device) and the entry points of torch_shim.h. The per-device spaces are
// space/device_spaces.hpp's, frees parked during CUDA graph capture capture_parking.hpp's,
// the exception of an out-of-memory c10_oom.hpp's, the last error guard.hpp's.
// Invariants: the state is immortal (never destroyed at exit: torch frees tensors during its
// own static destruction), so a space pointer, once published, stays valid for the life of the
// process; normalized() is the one place the torch options get their defaults; the calling
// thread's current CUDA context is the same after every call as before it (the cuda backend
// switches contexts: CudaContextGuard).
#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "backend/cuda_context_guard.hpp"
#include "torch/c10_oom.hpp"
#include "torch/capture_parking.hpp"
#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"
#include "alloc/text.hpp"

namespace vta::capi::torch {

using vta::AddressSpace;
using vta::CudaContextGuard;
using vta::DeviceSpaces;

static_assert(DeviceSpaces::kMaxDevices == VTA_TORCH_MAX_DEVICES, "one device range for the shim and its spaces");

vta_torch_config_t default_config() {
  vta_torch_config_t c{};
  c.struct_size = sizeof c;
  c.on_failure = VTA_TORCH_FAIL_THROW;
  c.space.struct_size = sizeof c.space;
  c.space.backend = VTA_BACKEND_CUDA;
  return c;
}

namespace {

// The options as stored: fields that do not matter zeroed, so equal options compare equal.
vta_torch_config_t normalized(const vta_torch_config_t& in) {
  if (in.struct_size < sizeof(vta_torch_config_t))
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "vta_torch_config_t: struct_size too small");
  if (in.on_failure != VTA_TORCH_FAIL_RETURN_NULL && in.on_failure != VTA_TORCH_FAIL_THROW)
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "vta_torch_config_t: unknown on_failure policy " + std::to_string(in.on_failure));
  vta_torch_config_t c = default_config();
  c.on_failure = in.on_failure;
  c.space = in.space;
  c.space.struct_size = sizeof c.space;
  c.space.device = 0;  // the ordinal comes with each request
  c.space.flags = 0;   // torch spaces create their own pages (never leased)
  // Torch hands these pointers to CUDA kernels: "auto" must never fall back to host memory.
  if (c.space.backend == VTA_BACKEND_AUTO) c.space.backend = VTA_BACKEND_CUDA;
  if (c.space.backend != VTA_BACKEND_CUDA && c.space.backend != VTA_BACKEND_HOST)
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(c.space.backend));
  return c;
}

}  // namespace

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

std::string oom_message(int device, const vta::OutOfMemory& e) {
  return "CUDA out of memory (vtalloc, device " + std::to_string(device) + "): " + e.what() +
         ". Free tensors you no longer need, lower the batch size, or raise the capacity "
         "(VTALLOC_CAPACITY or enable(capacity=...))";
}

void record_failure(int device, FailureKind kind, const std::string& message, const vta::OutOfMemory* oom) {
  if (device < 0 || device >= VTA_TORCH_MAX_DEVICES) return;
  FailureRecord& r = shim().records[device];
  std::lock_guard<std::mutex> lk(r.mu);
  r.failures.alloc_failures++;
  if (kind == FailureKind::oom) r.failures.ooms++;
  if (kind == FailureKind::capture) r.failures.capture_refusals++;
  if (oom) {
    r.failures.last_oom_requested_bytes = oom->requested();
    r.failures.last_oom_capacity_bytes = oom->capacity();
    r.failures.last_oom_mapped_bytes = oom->mapped();
  }
  r.last_message = message;
}

void record_free_failure(int device, const std::string& message) noexcept {
  try {
    if (device < 0 || device >= VTA_TORCH_MAX_DEVICES) return;
    FailureRecord& r = shim().records[device];
    std::lock_guard<std::mutex> lk(r.mu);
    r.failures.free_failures++;
    r.last_message = message;
  } catch (...) {
  }
}

void count_deferred_free(int device) {
  FailureRecord& r = shim().records[device];
  std::lock_guard<std::mutex> lk(r.mu);
  r.failures.deferred_frees++;
}

// Free what was parked during a capture on `device`, once its stream no longer captures.
void flush_parked(int device, AddressSpace& space) {
  for (const std::string& error : shim().parking.flush(device, space)) record_free_failure(device, error);
}

}  // namespace vta::capi::torch

using namespace vta::capi::torch;  // NOLINT(google-build-using-namespace): this file defines it
using vta::capi::copy_out;
using vta::capi::guarded;
using vta::capi::need;

extern "C" {

const char* vta_torch_last_error(void) { return vta::capi::last_error().c_str(); }

vta_status_t vta_torch_normalize_config(const vta_torch_config_t* in, vta_torch_config_t* out) {
  return guarded([&] {
    need(in, "config");
    need(out, "output");
    *out = normalized(*in);
  });
}

vta_status_t vta_torch_configure(const vta_torch_config_t* config, vta_torch_config_t* kept) {
  return guarded([&] {
    need(config, "config");
    vta_torch_config_t c = normalized(*config);
    Shim& s = shim();
    std::lock_guard<std::mutex> lk(s.mu);
    bool unchanged = std::memcmp(&c, &s.config, sizeof c) == 0;
    if (!s.spaces.configure(c.space, unchanged))
      vta::fail(VTA_ERR_INVALID_ARGUMENT,
                "vtalloc's torch allocator is already serving tensors with other options; options can only change "
                "before the first allocation (or after vta_torch_release)");
    if (!unchanged || !(s.configured || s.spaces.any())) {  // the same options again: nothing to do
      s.config = c;
      s.configured = true;
      s.on_failure.store(c.on_failure, std::memory_order_release);
      s.cuda.store(c.space.backend == VTA_BACKEND_CUDA, std::memory_order_release);
    }
    if (kept) *kept = s.config;  // what is in force now: c itself, whichever branch ran
  });
}

vta_status_t vta_torch_get_config(vta_torch_config_t* out, int32_t* configured) {
  return guarded([&] {
    need(out, "output");
    Shim& s = shim();
    std::lock_guard<std::mutex> lk(s.mu);
    *out = s.config;
    if (configured) *configured = s.configured ? 1 : 0;
  });
}

void* vta_torch_alloc(size_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // torch never frees a null pointer
  FailureKind kind = FailureKind::other;
  std::string message;
  Shim& s = shim();
  try {
    DeviceSpaces::check_device(device);
    CudaContextGuard guard(s.cuda.load(std::memory_order_acquire));
    AddressSpace* space = &space_for(device);
    if (space->backend_kind() == VTA_BACKEND_CUDA) {
      flush_parked(device, *space);
      if (vta::capi::stream_capturing(VTA_BACKEND_CUDA, stream)) {
        kind = FailureKind::capture;
        vta::fail(VTA_ERR_INVALID_ARGUMENT,
                  "vtalloc cannot allocate while a CUDA graph is being captured on device " + std::to_string(device) +
                      ": PyTorch's pluggable allocator has no graph-private pools, so memory freed after the capture "
                      "could be reused under the graph. Allocate the graph's tensors before capture, or capture "
                      "with PyTorch's native allocator");
      }
    }
    return reinterpret_cast<void*>(space->malloc(size, reinterpret_cast<vta::StreamHandle>(stream)));
  } catch (const vta::OutOfMemory& e) {
    message = oom_message(device, e);
    record_failure(device, FailureKind::oom, message, &e);
    kind = FailureKind::oom;
  } catch (const std::exception& e) {
    message = std::string("vtalloc could not allocate ") + std::to_string(size) + " bytes on device " +
              std::to_string(device) + ": " + e.what();
    record_failure(device, kind, message, nullptr);
  } catch (...) {
    message = "vtalloc could not allocate: unknown internal error";
    record_failure(device, kind, message, nullptr);
  }
  if (s.on_failure.load(std::memory_order_acquire) == VTA_TORCH_FAIL_RETURN_NULL) return nullptr;
  // By design the one exception that leaves the shim: torch's global allocator has no other way
  // to fail, and its C++ callers turn it into a Python exception (see torch_shim.h).
  if (kind == FailureKind::oom) vta::c10_oom::throw_oom(message);
  throw std::runtime_error(message);
}

void vta_torch_free(void* ptr, size_t /*size*/, int device, void* stream) {
  if (!ptr) return;
  try {
    AddressSpace& space = existing_space(device, "no vtalloc address space serves device " + std::to_string(device));
    bool cuda = space.backend_kind() == VTA_BACKEND_CUDA;
    CudaContextGuard guard(cuda);
    if (cuda) {
      if (vta::capi::stream_capturing(VTA_BACKEND_CUDA, stream)) {
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
      CudaContextGuard guard(space.backend_kind() == VTA_BACKEND_CUDA);
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
    CudaContextGuard guard(space.backend_kind() == VTA_BACKEND_CUDA);
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
    CudaContextGuard guard(space.backend_kind() == VTA_BACKEND_CUDA);
    if (shim().pools.in_used_pool(device, address))
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "the block at " + vta::hex(address) +
                                              " belongs to a graph-private pool that still has users: a captured "
                                              "graph may use it at any replay, so it cannot be offloaded");
    *moved = space.offload(address);
  });
}

vta_status_t vta_torch_failures(int32_t device, vta_torch_failures_t* out, char* message, uint64_t message_capacity) {
  return guarded([&] {
    need(out, "output");
    DeviceSpaces::check_device(device);
    FailureRecord& r = shim().records[device];
    std::lock_guard<std::mutex> lk(r.mu);
    *out = r.failures;
    out->struct_size = sizeof *out;
    copy_out(r.last_message, message, message_capacity);
  });
}

vta_status_t vta_torch_release(void) {
  return guarded([&] {
    Shim& s = shim();
    std::lock_guard<std::mutex> lk(s.mu);
    CudaContextGuard guard(s.cuda.load(std::memory_order_acquire) && s.spaces.any());
    vta::Status closed = s.spaces.release(
        "vtalloc's torch allocator", [&](int d) { return s.parking.parked(d) + s.pools.cached_count(d); },
        default_config().space);
    s.pools.clear();
    for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
      s.limits[d].store(0, std::memory_order_release);
      std::lock_guard<std::mutex> mlk(s.accumulated[d].mu);
      s.accumulated[d].marks = vta_torch_device_stats_t{};
    }
    for (FailureRecord& r : s.records) {
      std::lock_guard<std::mutex> rlk(r.mu);
      r.failures = vta_torch_failures_t{};
      r.last_message.clear();
    }
    s.config = default_config();
    s.configured = false;
    s.on_failure.store(VTA_TORCH_FAIL_THROW, std::memory_order_release);
    s.cuda.store(true, std::memory_order_release);
    vta::check(closed);
  });
}

int32_t vta_torch_exception_kind(void) {
  try {
    return vta::c10_oom::binding().route != vta::c10_oom::Route::none ? VTA_TORCH_EXC_C10_OOM
                                                                      : VTA_TORCH_EXC_STD_BAD_ALLOC;
  } catch (...) {
    return VTA_TORCH_EXC_STD_BAD_ALLOC;  // out of host memory while binding: so would an OOM be
  }
}

vta_status_t vta_torch_oom_binding(int32_t* route, int32_t* abi, char* libraries, uint64_t libraries_capacity,
                                   char* reason, uint64_t reason_capacity) {
  return guarded([&] {
    need(route, "output");
    need(abi, "output");
    vta::c10_oom::Report r = vta::c10_oom::binding();
    *route = static_cast<int32_t>(r.route);
    *abi = static_cast<int32_t>(r.abi);
    copy_out(r.libraries, libraries, libraries_capacity);
    copy_out(r.reason, reason, reason_capacity);
  });
}

vta_status_t vta_torch_exception_selftest(const char* message, int32_t route, char* type_name, uint64_t type_capacity,
                                          char* what, uint64_t what_capacity, int32_t* caught) {
  return guarded([&] {
    need(message, "message");
    need(caught, "output");
    if (route < VTA_TORCH_OOM_ROUTE_NONE || route > VTA_TORCH_OOM_ROUTE_BASE_VTABLE)
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown route " + std::to_string(route));
    vta::c10_oom::SelfTest t = vta::c10_oom::selftest(message, static_cast<vta::c10_oom::Route>(route));
    copy_out(t.type_name, type_name, type_capacity);
    copy_out(t.what, what, what_capacity);
    *caught = (t.caught_as_oom ? VTA_TORCH_CAUGHT_AS_C10_OOM : 0) | (t.caught_as_error ? VTA_TORCH_CAUGHT_AS_C10_ERROR : 0);
  });
}

}  // extern "C"
