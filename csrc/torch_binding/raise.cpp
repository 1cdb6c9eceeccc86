// raise.hpp's out-of-line half: byte counts for messages and the two throws.
//
// Owns: nothing beyond the thrown objects, which the C++ runtime owns once thrown.
// Invariants: the exception objects are made by torch's exported constructors
// (c10::Error(SourceLocation, std::string) and the one OutOfMemoryError inherits), so whatever
// formatting they do runs inside libc10, with the iostream runtime torch itself uses.
#include "torch_binding/raise.hpp"

namespace vta_torch {

std::string bytes_text(uint64_t n) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

void raise_error(std::string message, const char* function, const char* file, uint32_t line) {
  throw c10::Error(c10::SourceLocation{function, file, line}, std::move(message));
}

void raise_oom(std::string message, const char* function, const char* file, uint32_t line) {
  throw c10::OutOfMemoryError(c10::SourceLocation{function, file, line}, std::move(message));
}

}  // namespace vta_torch
