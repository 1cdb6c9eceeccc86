// The PyTorch shim (torch_shim.h): per-device address spaces behind CUDAPluggableAllocator.
//
// Owns: the process-wide shim state (options, one lazily created AddressSpace per device,
// failure records, frees parked during CUDA graph capture) and the thread-local last error of
// the shim's status functions. The exception of an out-of-memory is c10_oom.hpp's.
// Invariants: the state is immortal (never destroyed at exit: torch frees tensors during its
// own static destruction); a space pointer, once published, stays valid for the life of the
// process (release() closes spaces but keeps the objects); the calling thread's current CUDA
// context is the same after every call as before it (the cuda backend switches contexts).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "space/address_space.hpp"
#include "backend/cuda_driver_api.hpp"
#include "capi/c10_oom.hpp"
#include "vtalloc/torch_shim.h"

namespace {

using vta::AddressSpace;

thread_local std::string t_last_error;

enum class FailureKind { oom, capture, other };

struct Parked {
  uintptr_t ptr;
  void* stream;
};

struct DeviceSlot {
  std::atomic<AddressSpace*> space{nullptr};
  std::atomic<size_t> parked_count{0};
  std::mutex mu;  // guards the fields below
  vta_torch_failures_t failures{};
  std::string last_message;
  std::vector<Parked> parked;
};

struct Shim {
  std::mutex mu;  // configuration, space creation, release
  bool configured = false;
  vta_torch_config_t config{};
  std::atomic<uint32_t> on_failure{VTA_TORCH_FAIL_THROW};
  std::atomic<bool> cuda{true};  // the configured backend is cuda (contexts and capture matter)
  DeviceSlot slots[VTA_TORCH_MAX_DEVICES];
  std::vector<std::unique_ptr<AddressSpace>> retired;  // closed by release(), never freed
};

vta_torch_config_t default_config() {
  vta_torch_config_t c{};
  c.struct_size = sizeof c;
  c.on_failure = VTA_TORCH_FAIL_THROW;
  c.space.struct_size = sizeof c.space;
  c.space.backend = VTA_BACKEND_CUDA;
  return c;
}

Shim& shim() {
  static Shim* s = [] {
    auto* p = new Shim();  // immortal, see the file comment
    p->config = default_config();
    return p;
  }();
  return *s;
}

template <typename F>
vta_status_t guarded(F&& body) noexcept {
  try {
    body();
    return VTA_OK;
  } catch (const vta::Error& e) {
    t_last_error = e.what();
    return e.code();
  } catch (const std::bad_alloc&) {
    t_last_error = "vtalloc: out of host memory for bookkeeping";
    return VTA_ERR_INTERNAL;
  } catch (const std::exception& e) {
    t_last_error = std::string("vtalloc internal error: ") + e.what();
    return VTA_ERR_INTERNAL;
  } catch (...) {
    t_last_error = "vtalloc internal error: unknown exception";
    return VTA_ERR_INTERNAL;
  }
}

void check_device(int device) {
  if (device < 0 || device >= VTA_TORCH_MAX_DEVICES)
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "device " + std::to_string(device) + " is out of range (vtalloc serves 0.." +
                                            std::to_string(VTA_TORCH_MAX_DEVICES - 1) + ")");
}

// Options as stored: fields that do not matter zeroed, so equal options compare equal.
vta_torch_config_t normalized(const vta_torch_config_t& in) {
  if (in.struct_size < sizeof(vta_torch_config_t))
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "vta_torch_config_t: struct_size too small");
  if (in.on_failure != VTA_TORCH_FAIL_RETURN_NULL && in.on_failure != VTA_TORCH_FAIL_THROW)
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "vta_torch_config_t: unknown on_failure policy " + std::to_string(in.on_failure));
  vta_torch_config_t c = default_config();
  c.on_failure = in.on_failure;
  c.space = in.space;
  c.space.struct_size = sizeof c.space;
  c.space.device = 0;
  c.space.flags = 0;  // torch spaces create their own pages (never leased)
  // Torch hands these pointers to CUDA kernels: "auto" must never fall back to host memory.
  if (c.space.backend == VTA_BACKEND_AUTO) c.space.backend = VTA_BACKEND_CUDA;
  if (c.space.backend != VTA_BACKEND_CUDA && c.space.backend != VTA_BACKEND_HOST)
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(c.space.backend));
  return c;
}

bool any_space_locked(Shim& s) {
  for (auto& slot : s.slots)
    if (slot.space.load(std::memory_order_acquire)) return true;
  return false;
}

AddressSpace* space_for(int device) {
  Shim& s = shim();
  DeviceSlot& slot = s.slots[device];
  AddressSpace* space = slot.space.load(std::memory_order_acquire);
  if (space) return space;
  std::lock_guard<std::mutex> lk(s.mu);
  space = slot.space.load(std::memory_order_acquire);
  if (space) return space;
  vta_config_t c = s.config.space;
  c.device = device;
  space = AddressSpace::create(c).release();
  slot.space.store(space, std::memory_order_release);
  return space;
}

// Restores the calling thread's current CUDA context on scope exit (the cuda backend makes its
// own device's primary context current and leaves it so; torch must not see its device change).
class ContextGuard {
 public:
  explicit ContextGuard(bool cuda) {
    if (!cuda) return;
    api_ = vta::cu::driver_api(nullptr);
    if (api_ && api_->cuCtxGetCurrent(&saved_) != vta::cu::CUDA_SUCCESS) api_ = nullptr;
  }
  ~ContextGuard() {
    if (!api_) return;
    vta::cu::CUcontext now = nullptr;
    if (api_->cuCtxGetCurrent(&now) == vta::cu::CUDA_SUCCESS && now != saved_) api_->cuCtxSetCurrent(saved_);
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  const vta::cu::DriverApi* api_ = nullptr;
  vta::cu::CUcontext saved_ = nullptr;
};

// Whether `stream` is capturing a CUDA graph. Resolved once libcuda is loaded (it is, once a
// cuda space exists); false when it cannot be asked.
bool capturing(void* stream) {
  using IsCapturing = int (*)(void*, int*);
  static IsCapturing fn = []() -> IsCapturing {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) return nullptr;
    return reinterpret_cast<IsCapturing>(dlsym(lib, "cuStreamIsCapturing"));
  }();
  if (!fn) return false;
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  return fn(stream, &status) == vta::cu::CUDA_SUCCESS && status != 0;
}

void record_failure(int device, FailureKind kind, const std::string& message, const vta::OutOfMemory* oom) {
  if (device < 0 || device >= VTA_TORCH_MAX_DEVICES) return;
  DeviceSlot& slot = shim().slots[device];
  std::lock_guard<std::mutex> lk(slot.mu);
  slot.failures.alloc_failures++;
  if (kind == FailureKind::oom) slot.failures.ooms++;
  if (kind == FailureKind::capture) slot.failures.capture_refusals++;
  if (oom) {
    slot.failures.last_oom_requested_bytes = oom->requested();
    slot.failures.last_oom_capacity_bytes = oom->capacity();
    slot.failures.last_oom_mapped_bytes = oom->mapped();
  }
  slot.last_message = message;
}

void record_free_failure(int device, const std::string& message) noexcept {
  try {
    if (device < 0 || device >= VTA_TORCH_MAX_DEVICES) return;
    DeviceSlot& slot = shim().slots[device];
    std::lock_guard<std::mutex> lk(slot.mu);
    slot.failures.free_failures++;
    slot.last_message = message;
  } catch (...) {
  }
}

// Free what was parked during a capture, once its stream is no longer capturing.
void flush_parked(int device, AddressSpace* space) {
  DeviceSlot& slot = shim().slots[device];
  if (slot.parked_count.load(std::memory_order_acquire) == 0) return;
  std::vector<Parked> ready;
  {
    std::lock_guard<std::mutex> lk(slot.mu);
    size_t keep = 0;
    for (const Parked& p : slot.parked) {
      if (capturing(p.stream))
        slot.parked[keep++] = p;
      else
        ready.push_back(p);
    }
    slot.parked.resize(keep);
    slot.parked_count.store(keep, std::memory_order_release);
  }
  for (const Parked& p : ready) {
    try {
      space->free(p.ptr);
    } catch (const std::exception& e) {
      record_free_failure(device, std::string("vtalloc: deferred free failed: ") + e.what());
    }
  }
}

void copy_out(const std::string& s, char* buf, uint64_t capacity) {
  if (!buf || capacity == 0) return;
  size_t n = std::min<uint64_t>(s.size(), capacity - 1);
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

}  // namespace

extern "C" {

const char* vta_torch_last_error(void) { return t_last_error.c_str(); }

vta_status_t vta_torch_configure(const vta_torch_config_t* config) {
  return guarded([&] {
    if (!config) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null config");
    vta_torch_config_t c = normalized(*config);
    Shim& s = shim();
    std::lock_guard<std::mutex> lk(s.mu);
    if (any_space_locked(s)) {
      if (std::memcmp(&c, &s.config, sizeof c) == 0) return;  // the same options again: nothing to do
      vta::fail(VTA_ERR_INVALID_ARGUMENT,
                "vtalloc's torch allocator is already serving tensors with other options; options can only change "
                "before the first allocation (or after vta_torch_release)");
    }
    s.config = c;
    s.configured = true;
    s.on_failure.store(c.on_failure, std::memory_order_release);
    s.cuda.store(c.space.backend == VTA_BACKEND_CUDA, std::memory_order_release);
  });
}

vta_status_t vta_torch_get_config(vta_torch_config_t* out, int32_t* configured) {
  return guarded([&] {
    if (!out) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null output");
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
    check_device(device);
    ContextGuard guard(s.cuda.load(std::memory_order_acquire));
    AddressSpace* space = space_for(device);
    if (space->backend_kind() == VTA_BACKEND_CUDA) {
      flush_parked(device, space);
      if (capturing(stream)) {
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
    message = "CUDA out of memory (vtalloc, device " + std::to_string(device) + "): " + e.what() +
              ". Free tensors you no longer need, lower the batch size, or raise the capacity "
              "(VTALLOC_CAPACITY or enable(capacity=...))";
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
    check_device(device);
    DeviceSlot& slot = shim().slots[device];
    AddressSpace* space = slot.space.load(std::memory_order_acquire);
    if (!space) vta::fail(VTA_ERR_INVALID_ARGUMENT, "no vtalloc address space serves device " + std::to_string(device));
    bool cuda = space->backend_kind() == VTA_BACKEND_CUDA;
    ContextGuard guard(cuda);
    if (cuda) {
      if (capturing(stream)) {
        // Recording the free's event on a capturing stream would put it in the graph; free later.
        std::lock_guard<std::mutex> lk(slot.mu);
        slot.parked.push_back(Parked{reinterpret_cast<uintptr_t>(ptr), stream});
        slot.parked_count.store(slot.parked.size(), std::memory_order_release);
        slot.failures.deferred_frees++;
        return;
      }
      flush_parked(device, space);
    }
    space->free(reinterpret_cast<uintptr_t>(ptr));
  } catch (const std::exception& e) {
    record_free_failure(device, std::string("vtalloc could not free a tensor's memory: ") + e.what());
  } catch (...) {
    record_free_failure(device, "vtalloc could not free a tensor's memory: unknown internal error");
  }
}

vta_status_t vta_torch_devices(uint64_t* mask) {
  return guarded([&] {
    if (!mask) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null output");
    uint64_t m = 0;
    for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d)
      if (shim().slots[d].space.load(std::memory_order_acquire)) m |= 1ull << d;
    *mask = m;
  });
}

vta_status_t vta_torch_stats(int32_t device, vta_stats_t* out) {
  return guarded([&] {
    if (!out) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null output");
    check_device(device);
    AddressSpace* space = shim().slots[device].space.load(std::memory_order_acquire);
    if (!space) {
      *out = vta_stats_t{};
      out->struct_size = sizeof *out;
      return;
    }
    ContextGuard guard(space->backend_kind() == VTA_BACKEND_CUDA);
    *out = space->stats();
  });
}

vta_status_t vta_torch_reset_peak_stats(int32_t device) {
  return guarded([&] {
    if (device != -1) check_device(device);
    for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
      if (device != -1 && d != device) continue;
      AddressSpace* space = shim().slots[d].space.load(std::memory_order_acquire);
      if (space) space->reset_peak_stats();
    }
  });
}

vta_status_t vta_torch_trim(int32_t device, uint64_t* out_released) {
  return guarded([&] {
    if (device != -1) check_device(device);
    uint64_t released = 0;
    for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
      if (device != -1 && d != device) continue;
      AddressSpace* space = shim().slots[d].space.load(std::memory_order_acquire);
      if (!space) continue;
      ContextGuard guard(space->backend_kind() == VTA_BACKEND_CUDA);
      released += space->trim();
    }
    if (out_released) *out_released = released;
  });
}

// Residency of the allocations behind torch's tensors (paged_activations on CUDA). The
// space must exist already: these calls never create one.
vta_status_t vta_torch_residency_op(int32_t device, int32_t op, uint64_t address, uint64_t stream,
                                    int32_t use_stream, int32_t* out) {
  return guarded([&] {
    check_device(device);
    AddressSpace* space = shim().slots[device].space.load(std::memory_order_acquire);
    if (!space) vta::fail(VTA_ERR_INVALID_ARGUMENT, "no vtalloc address space serves this device yet");
    ContextGuard guard(space->backend_kind() == VTA_BACKEND_CUDA);
    const uint64_t* consumer = use_stream ? &stream : nullptr;
    switch (op) {
      case VTA_TORCH_OP_SET_EVICTABLE: space->set_evictable(address, true); break;
      case VTA_TORCH_OP_CLEAR_EVICTABLE: space->set_evictable(address, false); break;
      case VTA_TORCH_OP_OFFLOAD: space->offload(address); break;
      case VTA_TORCH_OP_PREFETCH: space->prefetch(address, consumer); break;
      case VTA_TORCH_OP_ENSURE_RESIDENT: space->ensure_resident(address, consumer); break;
      case VTA_TORCH_OP_RESIDENCY:
        if (!out) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null output");
        *out = space->residency(address);
        break;
      default: vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown residency operation " + std::to_string(op));
    }
  });
}

vta_status_t vta_torch_failures(int32_t device, vta_torch_failures_t* out, char* message, uint64_t message_capacity) {
  return guarded([&] {
    if (!out) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null output");
    check_device(device);
    DeviceSlot& slot = shim().slots[device];
    std::lock_guard<std::mutex> lk(slot.mu);
    *out = slot.failures;
    out->struct_size = sizeof *out;
    copy_out(slot.last_message, message, message_capacity);
  });
}

vta_status_t vta_torch_release(void) {
  return guarded([&] {
    Shim& s = shim();
    std::lock_guard<std::mutex> lk(s.mu);
    for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
      DeviceSlot& slot = s.slots[d];
      AddressSpace* space = slot.space.load(std::memory_order_acquire);
      if (!space) continue;
      ContextGuard guard(space->backend_kind() == VTA_BACKEND_CUDA);
      uint64_t live = space->stats().num_live_allocs;
      size_t parked = slot.parked_count.load(std::memory_order_acquire);
      if (live || parked)
        vta::fail(VTA_ERR_INVALID_ARGUMENT, "cannot release vtalloc's torch allocator: device " + std::to_string(d) +
                                                " still has " + std::to_string(live + parked) + " live allocation(s)");
    }
    vta::Status first_error;
    for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
      DeviceSlot& slot = s.slots[d];
      AddressSpace* space = slot.space.exchange(nullptr, std::memory_order_acq_rel);
      {
        std::lock_guard<std::mutex> slk(slot.mu);
        slot.failures = vta_torch_failures_t{};
        slot.last_message.clear();
      }
      if (!space) continue;
      s.retired.emplace_back(space);  // a racing caller may still hold the pointer: keep the object
      ContextGuard guard(space->backend_kind() == VTA_BACKEND_CUDA);
      try {
        space->close();
      } catch (const vta::Error& e) {
        if (first_error.is_ok()) first_error = vta::Status(e.code(), e.what());
      }
    }
    s.config = default_config();
    s.configured = false;
    s.on_failure.store(VTA_TORCH_FAIL_THROW, std::memory_order_release);
    s.cuda.store(true, std::memory_order_release);
    vta::check(first_error);
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
    if (!route || !abi) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null output");
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
    if (!message || !caught) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null message or output");
    if (route < VTA_TORCH_OOM_ROUTE_NONE || route > VTA_TORCH_OOM_ROUTE_BASE_VTABLE)
      vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown route " + std::to_string(route));
    vta::c10_oom::SelfTest t = vta::c10_oom::selftest(message, static_cast<vta::c10_oom::Route>(route));
    copy_out(t.type_name, type_name, type_capacity);
    copy_out(t.what, what, what_capacity);
    *caught = (t.caught_as_oom ? VTA_TORCH_CAUGHT_AS_C10_OOM : 0) | (t.caught_as_error ? VTA_TORCH_CAUGHT_AS_C10_ERROR : 0);
  });
}

}  // extern "C"
