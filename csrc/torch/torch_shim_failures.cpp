// What the torch shim could not do, per device: the failure records (vta_torch_failures).
//
// Owns: what a failed allocation, a failed free and a free parked during a capture add to a
// device's record (record_failure, record_free_failure, count_deferred_free), what an
// out-of-memory says (oom_message), forgetting every record at vta_torch_release
// (forget_failures), and vta_torch_failures, which reads one device's record.
// Invariants: a record changes only under its own mutex; recording a failed free never throws
// (torch frees from destructors); an out-of-memory is recorded with the same fields and message
// whichever ABI saw it (torch_shim.h's vta_torch_alloc, torch_native.h's vta_torch_malloc).
#include <mutex>
#include <string>

#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"

namespace vta::capi::torch {

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

void forget_failures() {
  for (FailureRecord& r : shim().records) {
    std::lock_guard<std::mutex> lk(r.mu);
    r.failures = vta_torch_failures_t{};
    r.last_message.clear();
  }
}

}  // namespace vta::capi::torch

using namespace vta::capi::torch;  // NOLINT(google-build-using-namespace): this file defines it
using vta::DeviceSpaces;
using vta::capi::copy_out;
using vta::capi::guarded;
using vta::capi::need;

extern "C" {

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

}  // extern "C"
