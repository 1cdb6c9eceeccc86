// The call into a c10 built with the old (pre-C++11, copy-on-write) std::string: torch 2.3-2.6.
//
// Owns: construct_with_old_string (c10_string_call.hpp).
// Invariants: _GLIBCXX_USE_CXX11_ABI is 0 before any include, so every std::string in this
// file is the old one; no std::string leaves it (the interface is plain pointers).
#define _GLIBCXX_USE_CXX11_ABI 0

#include <string>

#include "torch/c10_string_call.hpp"

namespace vta::c10_oom {

extern const bool kHasOldString = _GLIBCXX_USE_CXX11_ABI == 0;

void construct_with_old_string(void* ctor, void* self, const SourceLocation& where, const char* text, size_t size) {
  using Ctor = void (*)(void*, SourceLocation, std::string);
  reinterpret_cast<Ctor>(ctor)(self, where, std::string(text, size));
}

}  // namespace vta::c10_oom
