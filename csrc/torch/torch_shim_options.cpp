// The torch shim's options (torch_shim.h): their defaults, their one normalization, and the
// entry points that set, read and normalize them.
//
// Owns: default_config() and normalized(), the one place the torch options get their defaults
// (space.device and space.flags zeroed, backend "auto" made the first registered backend of
// device memory: cuda), and the option fields of the shim state (Shim::config, configured,
// on_failure, backend): set by vta_torch_configure, forgotten by forget_options_locked at
// vta_torch_release, both under Shim::mu.
// Invariants: vta_torch_configure is one call: it normalizes, then applies and returns what it
// keeps, or refuses and changes nothing; the options change only while no space exists (to the
// very same options, it is a no-op).
#include <cstring>
#include <mutex>
#include <string>

#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"

namespace vta::capi::torch {

namespace {
// What "auto" means for torch: the first registered backend of device memory (cuda).
int32_t torch_auto_backend() {
  const BackendInfo* b = first_device_memory_backend();
  return b ? b->kind : VTA_BACKEND_AUTO;
}
}  // namespace

vta_torch_config_t default_config() {
  vta_torch_config_t c{};
  c.struct_size = sizeof c;
  c.on_failure = VTA_TORCH_FAIL_THROW;
  c.space.struct_size = sizeof c.space;
  c.space.backend = torch_auto_backend();
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
  // Torch hands these pointers to GPU kernels: "auto" must never fall back to host memory.
  if (c.space.backend == VTA_BACKEND_AUTO) c.space.backend = torch_auto_backend();
  if (!find_backend(c.space.backend))
    vta::fail(VTA_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(c.space.backend));
  return c;
}

}  // namespace

void forget_options_locked(Shim& s) {
  s.config = default_config();
  s.configured = false;
  s.on_failure.store(VTA_TORCH_FAIL_THROW, std::memory_order_release);
  s.backend.store(first_device_memory_backend(), std::memory_order_release);
}

}  // namespace vta::capi::torch

using namespace vta::capi::torch;  // NOLINT(google-build-using-namespace): this file defines it
using vta::capi::guarded;
using vta::capi::need;

extern "C" {

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
      s.backend.store(vta::find_backend(c.space.backend), std::memory_order_release);
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

}  // extern "C"
