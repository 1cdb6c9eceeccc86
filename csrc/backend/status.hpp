// Status and error types shared by every layer of the C++ core.
//
// Owns: `Status` (what a backend operation returns) and `Error` (what the layers above the
// backend throw internally). Invariant: an `Error` never escapes the C ABI; capi/ turns it
// into a vta_status_t plus a thread-local message.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "vtalloc/vtalloc.h"

namespace vta {

// Result of one driver-seam operation: a code and, on failure, a message.
class Status {
 public:
  Status() = default;
  Status(vta_status_t code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == VTA_OK; }
  vta_status_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  vta_status_t code_ = VTA_OK;
  std::string message_;
};

// Thrown inside the core; caught at the C ABI.
class Error : public std::runtime_error {
 public:
  Error(vta_status_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  vta_status_t code() const { return code_; }

 private:
  vta_status_t code_;
};

// Out-of-memory with the numbers a user needs to act on it.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& message, uint64_t requested, uint64_t capacity, uint64_t mapped)
      : Error(VTA_ERR_OUT_OF_MEMORY, message), requested_(requested), capacity_(capacity), mapped_(mapped) {}
  uint64_t requested() const { return requested_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t mapped() const { return mapped_; }

 private:
  uint64_t requested_, capacity_, mapped_;
};

inline void check(const Status& s) {
  if (!s.is_ok()) throw Error(s.code(), s.message());
}

[[noreturn]] inline void fail(vta_status_t code, const std::string& message) { throw Error(code, message); }

#define VTA_EXPECTS(cond, code, msg)                                            \
  do {                                                                          \
    if (!(cond)) ::vta::fail((code), std::string(msg));                         \
  } while (0)

#define VTA_INVARIANT(cond)                                                     \
  do {                                                                          \
    if (!(cond))                                                                \
      ::vta::fail(VTA_ERR_INTERNAL, std::string("invariant failed: " #cond " at ") + \
                                        __FILE__ + ":" + std::to_string(__LINE__)); \
  } while (0)

}  // namespace vta
