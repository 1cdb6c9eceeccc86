// C ABI of the backend registry (vta_backends in vtalloc.h; the tests' toy registration,
// vta_test_register_toy_backend, is capi/testing/toy_backend_capi.cpp).
//
// Owns: nothing but the edge: each registry entry copied into a vta_backend_info_t (its
// capabilities as VTA_BACKEND_CAP_* bits). Invariant: the bits name the BackendCapabilities
// fields one for one (backend.hpp).
#include <algorithm>
#include <cstring>
#include <utility>

#include "backend/backend_registry.hpp"
#include "capi/guard.hpp"
#include "vtalloc/vtalloc.h"

namespace {

uint32_t capability_bits(const vta::BackendCapabilities& c) {
  const std::pair<bool, uint32_t> flags[] = {
      {c.device_memory, VTA_BACKEND_CAP_DEVICE_MEMORY}, {c.needs_context, VTA_BACKEND_CAP_NEEDS_CONTEXT},
      {c.can_capture, VTA_BACKEND_CAP_CAN_CAPTURE},     {c.host_pages, VTA_BACKEND_CAP_HOST_PAGES},
      {c.export_pages, VTA_BACKEND_CAP_EXPORT_PAGES},   {c.test_kernels, VTA_BACKEND_CAP_TEST_KERNELS}};
  uint32_t bits = 0;
  for (auto [on, bit] : flags) bits |= on ? bit : 0u;
  return bits;
}

static_assert(vta::kMaxBackendName < VTA_BACKEND_NAME_MAX, "a registered name fits vta_backend_info_t.name");

}  // namespace

extern "C" {

vta_status_t vta_backends(vta_backend_info_t* out, uint64_t capacity, uint64_t* count) {
  return vta::capi::guarded([&] {
    vta::capi::need(count, "output");
    if (capacity) vta::capi::need(out, "output");
    size_t n = vta::backend_count();
    for (size_t i = 0; i < std::min<uint64_t>(n, capacity); ++i) {
      const vta::BackendInfo& b = *vta::backend_at(i);
      vta_backend_info_t row{};
      row.struct_size = sizeof row;
      row.backend = b.kind;
      row.capabilities = capability_bits(b.capabilities);
      std::memcpy(row.name, b.name.c_str(), b.name.size() + 1);
      out[i] = row;
    }
    *count = n;
  });
}

}  // extern "C"
