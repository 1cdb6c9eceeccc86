// Formatting for error messages of the core (the policy, the space, the torch glue): addresses and sizes.
//
// Owns: nothing but snprintf into small buffers (no iostreams in the core).
// Invariants: none beyond returning a fresh string.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace vta {

inline std::string hex(uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

inline std::string mib(uint64_t bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace vta
