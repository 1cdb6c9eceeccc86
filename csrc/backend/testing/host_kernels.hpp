// Test kernels for the host backend: stream work that writes and checks a byte pattern.
//
// Owns: the byte pattern of (seed, byte index), the FILL and CHECK kernel bodies, their duration
// limit, and what the host backend asks of them (test_kernel_refusal, run_test_kernel: declared in
// backend/fault_guard.hpp, so the backend queues them without including this room).
// Why: cuMemMap/cuMemUnmap/cuMemSetAccess are not stream-ordered, so changing a mapping under
// an address that queued or running stream work still touches is a race. Test kernels are
// stream work that reads and writes an allocation's bytes for a while, so a test can run
// paging, restore and reclaim under them and count faults and corrupted bytes on a CPU; they run
// under the fault guard (backend/fault_guard.hpp), which counts an illegal access instead of
// ending the process.
// Invariants: a kernel runs only on the host backend (other backends refuse it: backend.hpp);
// at least one whole pass runs, and passes repeat until its duration has elapsed; a CHECK
// counts only completed passes' bytes; tests/helpers/kernels.py is an independent Python
// reference of the pattern.
#pragma once

#include <cstdint>

#include "backend/fault_guard.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

// Test kernels run for at most this long (a longer one is refused as invalid).
constexpr uint64_t kMaxTestKernelNs = 60ull * 1000 * 1000 * 1000;

// The 8 pattern bytes of word `word` (bytes 8*word .. 8*word+7 of a kernel's range, in memory
// order, little-endian) for `seed`: a multiplicative hash, cheap enough for GiB/s.
inline uint64_t kernel_pattern_word(uint64_t seed, uint64_t word) {
  uint64_t x = seed * 0xD1B54A32D192ED03ull + (word + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

// run_test_kernel (fault_guard.hpp): VTA_KERNEL_FILL writes the pattern of `seed` over
// [va, va + bytes), VTA_KERNEL_CHECK counts the bytes that differ from it; whole passes repeat
// until `duration_ns` has elapsed (at least one). Counts completion or the fault, and a CHECK's
// bytes checked and mismatched (per completed pass) in `counters`.

}  // namespace vta
