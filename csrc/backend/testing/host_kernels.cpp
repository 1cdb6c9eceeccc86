// The test kernels' bodies; see host_kernels.hpp for what they are.
//
// Owns: nothing that outlives a call: the FILL and CHECK passes, the kernel body that repeats
// them for a duration, and the refusal of a kernel the host backend is asked to queue.
// Invariants: the kernel body is C-style (it runs under the fault guard: between sigsetjmp and
// the guard's end nothing with a destructor lives); its arguments and results live in
// run_test_kernel's frame, outside the guard.
#include "backend/testing/host_kernels.hpp"

#include <time.h>

#include <cstring>
#include <string>

namespace vta {
namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Bytes of x that are not zero (no popcount instruction needed).
inline uint64_t nonzero_bytes(uint64_t x) {
  const uint64_t low7 = 0x7F7F7F7F7F7F7F7Full;
  uint64_t high = (((x & low7) + low7) | x) & ~low7;  // 0x80 in each nonzero byte
  return ((high >> 7) * 0x0101010101010101ull) >> 56;  // their sum, in the top byte
}

void fill_pass(unsigned char* p, uint64_t bytes, uint64_t seed) {
  uint64_t words = bytes / 8;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w = kernel_pattern_word(seed, i);
    std::memcpy(p + 8 * i, &w, 8);
  }
  if (bytes % 8) {
    uint64_t w = kernel_pattern_word(seed, words);
    std::memcpy(p + 8 * words, &w, bytes % 8);
  }
}

uint64_t check_pass(const unsigned char* p, uint64_t bytes, uint64_t seed) {
  uint64_t words = bytes / 8, bad = 0;
  for (uint64_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    uint64_t diff = w ^ kernel_pattern_word(seed, i);
    if (diff) bad += nonzero_bytes(diff);
  }
  if (bytes % 8) {
    uint64_t w = 0, want = kernel_pattern_word(seed, words);
    std::memcpy(&w, p + 8 * words, bytes % 8);
    uint64_t mask = (1ull << (8 * (bytes % 8))) - 1;  // the tail's bytes, little-endian
    bad += nonzero_bytes((w ^ want) & mask);
  }
  return bad;
}

// A kernel's arguments and results; lives in run_test_kernel's frame, outside the guard.
struct Kernel {
  unsigned char* base;
  uint64_t bytes;
  int kind;
  uint64_t seed;
  uint64_t duration_ns;
  uint64_t checked;     // by completed CHECK passes
  uint64_t mismatched;
};

void kernel_body(void* arg) {
  Kernel* k = static_cast<Kernel*>(arg);
  uint64_t start = now_ns();
  do {
    if (k->kind == VTA_KERNEL_FILL) {
      fill_pass(k->base, k->bytes, k->seed);
    } else {
      uint64_t bad = check_pass(k->base, k->bytes, k->seed);
      k->mismatched += bad;
      k->checked += k->bytes;
    }
  } while (now_ns() - start < k->duration_ns);
}

}  // namespace

std::string test_kernel_refusal(int kind, uint64_t bytes, uint64_t duration_ns) {
  if (kind != VTA_KERNEL_FILL && kind != VTA_KERNEL_CHECK) return "test kernel: unknown kind " + std::to_string(kind);
  if (bytes == 0) return "test kernel: empty range";
  if (duration_ns > kMaxTestKernelNs) return "test kernel: duration above 60 s";
  return std::string();
}

void run_test_kernel(KernelCounters& counters, uintptr_t va, uint64_t bytes, int kind, uint64_t seed,
                     uint64_t duration_ns) {
  Kernel k{reinterpret_cast<unsigned char*>(va), bytes, kind, seed, duration_ns, 0, 0};
  bool completed = run_guarded(kernel_body, &k);
  counters.bytes_checked += k.checked;
  counters.bytes_mismatched += k.mismatched;
  if (completed) {
    counters.completed++;
  } else {
    counters.faulted++;
    count_kernel_fault();
  }
}

}  // namespace vta
