// The one allocation body behind both torch ABIs: vta_torch_alloc (the pluggable allocator,
// torch_shim.cpp) and vta_torch_malloc (the torch-native ABI, torch_native.cpp).
//
// Owns: torch_allocate (torch_shim_state.hpp) and the relaxed capture mode it holds while a
// graph-private pool serves an allocation during a capture. What differs between the ABIs is
// what they are given (a pool id: native only) and how a failure leaves them (a status, or
// torch's exception), which stay in their entry points; the steps are here once: the request
// checked, the configured backend's context kept, the space made, parked frees flushed, a
// capture refused unless a pool serves it, the block placed with the thread's region tag, and a
// failure recorded with the same message whichever ABI saw it.
// Invariants: a failure is recorded exactly once (record_failure) and then rethrown; the
// calling thread's context and stream-capture mode are the same after the call as before it.
#include <exception>
#include <memory>
#include <string>

#include "backend/backend_registry.hpp"
#include "backend/context_guard.hpp"
#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"

namespace vta::capi::torch {

namespace {

// The calling thread's stream-capture mode is relaxed while it lives: driver calls that a
// capture in the global mode would forbid (cuMemMap, event queries) are allowed while a pool
// serves an allocation during capture. A kind without the hooks (or a driver without the entry
// point) changes nothing.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(const BackendInfo& backend) {
    if (backend.relax_capture_mode && backend.relax_capture_mode(&previous_)) restore_ = backend.restore_capture_mode;
  }
  ~RelaxedCaptureMode() {
    if (restore_) restore_(previous_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  void (*restore_)(int) = nullptr;  // the kind's restore hook while relaxed
  int previous_ = 0;
};

// Why an allocation on a capturing stream without a pool is refused, in each ABI's words.
std::string capture_refusal(TorchAbi abi, int device) {
  if (abi == TorchAbi::pluggable)
    return "vtalloc cannot allocate while a CUDA graph is being captured on device " + std::to_string(device) +
           ": PyTorch's pluggable allocator has no graph-private pools, so memory freed after the capture "
           "could be reused under the graph. Allocate the graph's tensors before capture, or capture "
           "with PyTorch's native allocator";
  return "vtalloc cannot allocate on device " + std::to_string(device) +
         " while a CUDA graph is being captured on this stream without a graph-private pool: pass the capture's pool";
}

uintptr_t place(uint64_t size, int device, void* stream, const vta_torch_pool_id_t* pool, TorchAbi abi,
                FailureKind* kind) {
  if (size == 0) vta::fail(VTA_ERR_INVALID_ARGUMENT, "allocation size must be positive");
  DeviceSpaces::check_device(device);
  Shim& s = shim();
  ContextGuard guard(s.backend.load(std::memory_order_acquire));
  AddressSpace& space = space_for(device);
  auto handle = reinterpret_cast<vta::StreamHandle>(stream);
  bool in_pool = PrivatePools::is_pool(pool);
  bool capturing = false;
  if (space.capabilities().can_capture) {
    flush_parked(device, space);
    capturing = vta::capi::stream_capturing(space.backend_kind(), stream);
    if (capturing && !in_pool) {
      *kind = FailureKind::capture;
      vta::fail(VTA_ERR_INVALID_ARGUMENT, capture_refusal(abi, device));
    }
  }
  std::unique_ptr<RelaxedCaptureMode> relaxed;
  if (capturing) relaxed = std::make_unique<RelaxedCaptureMode>(space.backend_info());
  uint32_t region = current_region();
  return in_pool ? s.pools.malloc(device, pool_key(*pool), space, size, handle, region)
                 : space.malloc(size, handle, true, true, region);
}

}  // namespace

uintptr_t torch_allocate(uint64_t size, int device, void* stream, const vta_torch_pool_id_t* pool, TorchAbi abi,
                         std::string* failure) {
  FailureKind kind = FailureKind::other;
  try {
    return place(size, device, stream, pool, abi, &kind);
  } catch (const vta::OutOfMemory& e) {
    *failure = oom_message(device, e);
    record_failure(device, FailureKind::oom, *failure, &e);
    throw vta::OutOfMemory(*failure, e.requested(), e.capacity(), e.mapped());
  } catch (const std::exception& e) {
    *failure = "vtalloc could not allocate " + std::to_string(size) + " bytes on device " + std::to_string(device) +
               ": " + e.what();
    record_failure(device, kind, *failure, nullptr);
    throw;
  } catch (...) {
    *failure = "vtalloc could not allocate: unknown internal error";
    record_failure(device, kind, *failure, nullptr);
    throw;
  }
}

}  // namespace vta::capi::torch
