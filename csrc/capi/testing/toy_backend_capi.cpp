// C ABI of the registry's toy backend (vta_test_register_toy_backend in vtalloc.h): a test
// registers it at run time (tests/test_backend_registry.py).
//
// Owns: nothing but the edge; the toy is backend/testing/toy_backend.cpp's. Invariants: those
// of capi.cpp (the body runs in guarded(); no exception crosses).
#include <cstdint>

#include "backend/status.hpp"
#include "backend/testing/toy_backend.hpp"
#include "capi/guard.hpp"
#include "vtalloc/vtalloc.h"

extern "C" {

vta_status_t vta_test_register_toy_backend(const char* name, int32_t* backend) {
  return vta::capi::guarded([&] {
    vta::capi::need(name, "name");
    int kind = 0;
    vta::check(vta::register_toy_backend(name, &kind));
    if (backend) *backend = kind;
  });
}

}  // extern "C"
