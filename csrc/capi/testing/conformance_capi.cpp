// C ABI of the driver-seam conformance check (vta_backend_conformance in vtalloc.h).
//
// Owns: nothing but the edge: the body runs under guarded(), the report is copied into the
// caller's buffer (cut to fit, always NUL-terminated). The checks are backend/testing/conformance.cpp's;
// a test-facing entry point, so it lives under capi/testing/ (only testing/ files include testing/ headers).
#include <string>

#include "backend/testing/conformance.hpp"
#include "capi/guard.hpp"
#include "vtalloc/vtalloc.h"

extern "C" vta_status_t vta_backend_conformance(int32_t backend, int32_t device, char* report, uint64_t report_len,
                                                int32_t* out_failures) {
  return vta::capi::guarded([&] {
    vta::capi::need(out_failures, "failures output");
    std::string text;
    int failures = 0;
    vta::check(vta::run_conformance(backend, device, &text, &failures));
    *out_failures = failures;
    vta::capi::copy_out(text, report, report_len);
  });
}
