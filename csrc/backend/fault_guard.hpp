// The fault guard: an illegal access by the host backend's stream work stops that work and is
// counted, instead of ending the process.
//
// Owns: the process-wide SIGSEGV/SIGBUS handler with the per-thread guard it jumps back to, the
// process-wide fault totals, guarded copies, and KernelCounters (one backend's tally of its test
// kernels and guarded copies).
// Why: cuMemMap/cuMemUnmap/cuMemSetAccess are not stream-ordered, so changing a mapping under
// an address that queued or running stream work still touches is a race. The host backend runs
// its copies (and the test kernels, backend/testing/host_kernels.hpp) under this guard, so a
// test can run paging, restore and reclaim under stream work and count faults and corrupted
// bytes on a CPU.
// Invariants: the handler is installed once, from a normal thread, never in a signal
// context; it jumps only into a guard armed on the faulting thread, for a real fault
// (si_code > 0), and otherwise chains to the handler that was installed before it, so a crash
// outside every guard still crashes (with pytest's faulthandler traceback, where installed);
// guarded code holds no object with a destructor between sigsetjmp and the guard's end.
// Difference from CUDA: on a GPU an illegal address (CUDA_ERROR_ILLEGAL_ADDRESS) poisons the
// context and every later call fails. Here the faulted kernel or copy stops, a counter goes
// up, and the process carries on, so a stress test can count the races instead of dying.
// A faulted copy is abandoned part-way: its destination holds whatever it held plus any
// prefix copied before the fault.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "vtalloc/vtalloc.h"

namespace vta {

// One backend's tally (the fields of vta_kernel_counters_t).
struct KernelCounters {
  std::atomic<uint64_t> launched{0}, completed{0}, faulted{0}, copy_faults{0}, bytes_checked{0}, bytes_mismatched{0};
  vta_kernel_counters_t snapshot() const;
};

// Install the guard's SIGSEGV/SIGBUS handler once (idempotent, thread-safe; normal threads only).
void install_fault_guard();

// Runs fn(arg) on the calling thread with its guard armed; true when it ran to the end, false
// when a SIGSEGV/SIGBUS stopped it. fn is C-style: nothing with a destructor lives in it.
bool run_guarded(void (*fn)(void*), void* arg);

// memmove under the guard; false (and one more counters.copy_faults) when it faulted.
bool guarded_copy(KernelCounters& counters, void* dst, const void* src, size_t bytes);

// Count one test kernel stopped by the guard in the process totals (backend/testing/host_kernels.cpp).
void count_kernel_fault();

// Faults the guards caught in this process, every backend together (never reset).
void guarded_fault_totals(uint64_t* kernel_faults, uint64_t* copy_faults);

// The host backend's test kernels are test code (backend/testing/host_kernels.cpp defines these):
// declared here so the backend queues them without including the testing room, as backend.hpp
// declares make_cost_model_backend.
// Why a test kernel is refused (an unknown kind, an empty range, too long a duration); empty
// when it may run.
std::string test_kernel_refusal(int kind, uint64_t bytes, uint64_t duration_ns);
// Run one test kernel on the calling thread, under the guard, counting it in `counters`.
void run_test_kernel(KernelCounters& counters, uintptr_t va, uint64_t bytes, int kind, uint64_t seed,
                     uint64_t duration_ns);

}  // namespace vta
