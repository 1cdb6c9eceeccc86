// The C ABI's test entry points over address spaces (vta_debug_* in vtalloc.h): what tests
// reach that users never call (allocator/_test_hooks.py is their Python side).
//
// Owns: nothing but the edge: each entry point checks its outputs and calls TestingSpace
// (space/testing/testing_space.hpp) on the open space, or reads the fault guard's totals.
// Invariants: those of capi.cpp (every body runs in guarded(); no exception crosses); the
// entry points' names and signatures are the public header's, unchanged by where they live.
#include <cstdint>

#include "backend/fault_guard.hpp"
#include "capi/guard.hpp"
#include "capi/space_handle.hpp"
#include "space/testing/testing_space.hpp"
#include "vtalloc/vtalloc.h"

namespace {

using vta::capi::guarded;
using vta::capi::need;

vta::TestingSpace testing(vta_space_t* space) { return vta::TestingSpace(vta::capi::open_space(space)); }

}  // namespace

extern "C" {

vta_status_t vta_debug_inject_fault(vta_space_t* space, int32_t op, int32_t times) {
  return guarded([&] { testing(space).inject_fault(op, times); });
}

vta_status_t vta_debug_inject_fault_after(vta_space_t* space, int32_t op, int32_t skip, int32_t times) {
  return guarded([&] { testing(space).inject_fault(op, times, skip); });
}

vta_status_t vta_debug_break_ordering(vta_space_t* space, uint32_t mask) {
  return guarded([&] { testing(space).break_ordering(mask); });
}

vta_status_t vta_debug_stream_create(vta_space_t* space, uint64_t* out_stream) {
  return guarded([&] {
    need(out_stream, "output");
    *out_stream = testing(space).create_stream();
  });
}

vta_status_t vta_debug_stream_destroy(vta_space_t* space, uint64_t stream) {
  return guarded([&] { testing(space).destroy_stream(stream); });
}

vta_status_t vta_debug_stream_synchronize(vta_space_t* space, uint64_t stream) {
  return guarded([&] { testing(space).synchronize_stream(stream); });
}

vta_status_t vta_debug_run_kernel(vta_space_t* space, uint64_t stream, uint64_t address, uint64_t nbytes, int32_t kind,
                                  uint64_t seed, uint64_t duration_ns) {
  return guarded([&] { testing(space).run_test_kernel(stream, address, nbytes, kind, seed, duration_ns); });
}

vta_status_t vta_debug_kernel_counters(vta_space_t* space, vta_kernel_counters_t* out) {
  return guarded([&] {
    need(out, "output");
    *out = testing(space).kernel_counters();
  });
}

vta_status_t vta_debug_victim_counters(vta_space_t* space, uint64_t* out_candidate_pages,
                                       uint64_t* out_entries_touched) {
  return guarded([&] {
    need(out_candidate_pages, "candidate pages output");
    need(out_entries_touched, "entries touched output");
    testing(space).victim_counters(out_candidate_pages, out_entries_touched);
  });
}

vta_status_t vta_debug_fault_totals(uint64_t* out_kernel_faults, uint64_t* out_copy_faults) {
  return guarded([&] {
    need(out_kernel_faults, "kernel faults output");
    need(out_copy_faults, "copy faults output");
    vta::guarded_fault_totals(out_kernel_faults, out_copy_faults);
  });
}

}  // extern "C"
