// Test kernels for the host backend, and the fault guard that contains an illegal access.
//
// Owns: the byte pattern of (seed, byte index), the FILL and CHECK kernel bodies, the
// process-wide SIGSEGV/SIGBUS handler with the per-thread guard it jumps back to, and the
// counters of one backend's kernels and guarded copies.
// Why: cuMemMap/cuMemUnmap/cuMemSetAccess are not stream-ordered, so changing a mapping under
// an address that queued or running stream work still touches is a race. Test kernels are
// stream work that reads and writes an allocation's bytes for a while, so a test can run
// paging, restore and reclaim under them and count faults and corrupted bytes on a CPU.
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

#include "vtalloc/vtalloc.h"

namespace vta {

// Test kernels run for at most this long (a longer one is refused as invalid).
constexpr uint64_t kMaxTestKernelNs = 60ull * 1000 * 1000 * 1000;

// One backend's tally (the fields of vta_kernel_counters_t).
struct KernelCounters {
  std::atomic<uint64_t> launched{0}, completed{0}, faulted{0}, copy_faults{0}, bytes_checked{0}, bytes_mismatched{0};
  vta_kernel_counters_t snapshot() const;
};

// The 8 pattern bytes of word `word` (bytes 8*word .. 8*word+7 of a kernel's range, in memory
// order, little-endian) for `seed`: a multiplicative hash, cheap enough for GiB/s.
inline uint64_t kernel_pattern_word(uint64_t seed, uint64_t word) {
  uint64_t x = seed * 0xD1B54A32D192ED03ull + (word + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

// Install the guard's SIGSEGV/SIGBUS handler once (idempotent, thread-safe; normal threads only).
void install_fault_guard();

// Run one kernel on the calling thread, under the guard: VTA_KERNEL_FILL writes the pattern of
// `seed` over [va, va + bytes), VTA_KERNEL_CHECK counts the bytes that differ from it; whole
// passes repeat until `duration_ns` has elapsed (at least one). Counts completion or the fault,
// and a CHECK's bytes checked and mismatched (per completed pass) in `counters`.
void run_test_kernel(KernelCounters& counters, uintptr_t va, uint64_t bytes, int kind, uint64_t seed,
                     uint64_t duration_ns);

// memmove under the guard; false (and one more counters.copy_faults) when it faulted.
bool guarded_copy(KernelCounters& counters, void* dst, const void* src, size_t bytes);

// Faults the guards caught in this process, every backend together (never reset).
void guarded_fault_totals(uint64_t* kernel_faults, uint64_t* copy_faults);

}  // namespace vta
