// The torch-native binding's errors: messages built without iostreams, thrown as torch's own types.
//
// Owns: text() (a message from strings and numbers, formatted with snprintf/std::to_string) and
// raise_error/raise_oom (throw c10::Error / c10::OutOfMemoryError made by torch's out-of-line
// (SourceLocation, std::string) constructor, which formats its own context inside libc10).
// Invariants:
//  - Nothing here, and nothing in the binding, formats through a C++ stream: no c10::str, no
//    TORCH_CHECK/TORCH_CHECK_WITH/TORCH_WARN (they build their message with c10::str, an
//    std::ostringstream), no <sstream>, no operator<< on a number. On the GPU image of 2026-11-28 a
//    number inserted into a stream by the binding's own code crashed the process (docs/design.md,
//    "No iostreams in the core or the binding"); tests/test_torch_binding_symbols.py fails the
//    build's objects on any stream or locale symbol, and binding_build refuses a built library
//    that imports one.
//  - Raising never allocates through vtalloc and never calls back into it.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>

namespace vta_torch {

namespace text_detail {

inline void put(std::string& out, const char* s) { out += (s != nullptr ? s : "(null)"); }
inline void put(std::string& out, const std::string& s) { out += s; }
inline void put(std::string& out, char c) { out += c; }
inline void put(std::string& out, bool b) { out += b ? "true" : "false"; }
inline void put(std::string& out, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  out += buf;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                                  !std::is_same_v<T, char>>>
inline void put(std::string& out, T v) {
  // c10::DeviceIndex is int8_t: printed as a number, never as a character.
  if constexpr (std::is_signed_v<T>) {
    out += std::to_string(static_cast<long long>(v));
  } else {
    out += std::to_string(static_cast<unsigned long long>(v));
  }
}

}  // namespace text_detail

// One message from its pieces (strings, characters, integers, doubles), in order.
template <typename... Pieces>
std::string text(const Pieces&... pieces) {
  std::string out;
  (text_detail::put(out, pieces), ...);
  return out;
}

// "1.50 GiB", "512 B": a byte count for a message.
std::string bytes_text(uint64_t n);

// Throw c10::Error / c10::OutOfMemoryError with `message`, located at (function, file, line).
[[noreturn]] void raise_error(std::string message, const char* function, const char* file, uint32_t line);
[[noreturn]] void raise_oom(std::string message, const char* function, const char* file, uint32_t line);

}  // namespace vta_torch

// The binding's TORCH_CHECK: the message is built only when the condition fails, and never
// through a stream. Pieces are text()'s.
#define VTA_CHECK(cond, ...)                                                                      \
  do {                                                                                            \
    if (!(cond)) ::vta_torch::raise_error(::vta_torch::text(__VA_ARGS__), __func__, __FILE__,    \
                                          static_cast<uint32_t>(__LINE__));                       \
  } while (0)
#define VTA_RAISE(...) \
  ::vta_torch::raise_error(::vta_torch::text(__VA_ARGS__), __func__, __FILE__, static_cast<uint32_t>(__LINE__))
#define VTA_RAISE_OOM(...) \
  ::vta_torch::raise_oom(::vta_torch::text(__VA_ARGS__), __func__, __FILE__, static_cast<uint32_t>(__LINE__))
