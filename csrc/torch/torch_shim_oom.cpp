// The C face of the out-of-memory exception's binding (torch_shim.h, over c10_oom.hpp): which
// exception an out-of-memory would throw now, how it is bound, and the self-test that throws
// and catches it inside the library.
//
// Owns: nothing but the edge: each body runs under guarded() (vta_torch_exception_kind, which
// returns no status, catches everything itself), and reports are copied out cut to fit. The
// binding and the throw are c10_oom.cpp's.
#include <string>

#include "capi/guard.hpp"
#include "torch/c10_oom.hpp"
#include "vtalloc/torch_shim.h"

using vta::capi::copy_out;
using vta::capi::guarded;
using vta::capi::need;

extern "C" {

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
