// The C ABI guard: how every entry point turns exceptions into a status and a message.
//
// Owns: the thread-local last error and last out-of-memory numbers (one pair for the whole C
// ABI: vta_last_error and vta_torch_last_error read the same message), `guarded()`, which runs
// a body and catches everything, so no exception ever crosses the C ABI, and the small helpers
// every entry point uses at the edge (need, copy_out).
// Invariant: every extern "C" function that returns a vta_status_t runs its body in guarded().
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "backend/status.hpp"
#include "vtalloc/vtalloc.h"

namespace vta::capi {

inline std::string& last_error() {
  thread_local std::string message;
  return message;
}

inline uint64_t* last_oom() {
  thread_local uint64_t numbers[3] = {0, 0, 0};
  return numbers;
}

template <typename F>
inline vta_status_t guarded(F&& body) noexcept {
  try {
    body();
    return VTA_OK;
  } catch (const vta::OutOfMemory& e) {
    last_error() = e.what();
    last_oom()[0] = e.requested();
    last_oom()[1] = e.capacity();
    last_oom()[2] = e.mapped();
    return VTA_ERR_OUT_OF_MEMORY;
  } catch (const vta::Error& e) {
    last_error() = e.what();
    return e.code();
  } catch (const std::bad_alloc&) {
    last_error() = "vtalloc: out of host memory for bookkeeping";
    return VTA_ERR_INTERNAL;
  } catch (const std::exception& e) {
    last_error() = std::string("vtalloc internal error: ") + e.what();
    return VTA_ERR_INTERNAL;
  } catch (...) {
    last_error() = "vtalloc internal error: unknown exception";
    return VTA_ERR_INTERNAL;
  }
}

template <typename T>
inline void need(T* p, const char* what) {
  if (!p) vta::fail(VTA_ERR_INVALID_ARGUMENT, std::string("null ") + what);
}

// Copies `s` into a caller's buffer of `capacity` bytes: cut to fit, always NUL-terminated;
// nothing when the buffer is null or empty.
inline void copy_out(const std::string& s, char* buf, uint64_t capacity) {
  if (!buf || capacity == 0) return;
  size_t n = std::min<uint64_t>(s.size(), capacity - 1);
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

}  // namespace vta::capi
