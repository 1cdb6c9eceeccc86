// The call into a c10 built with the C++11 std::string (std::__cxx11::basic_string): torch 2.7+.
//
// Owns: construct_with_cxx11_string (c10_string_call.hpp).
// Invariants: _GLIBCXX_USE_CXX11_ABI is 1 before any include, whatever the compiler's default,
// so every std::string in this file is the new one; no std::string leaves it.
#define _GLIBCXX_USE_CXX11_ABI 1

#include <string>

#include "torch/c10_string_call.hpp"

namespace vta::c10_oom {

extern const bool kHasCxx11String = _GLIBCXX_USE_CXX11_ABI == 1;

void construct_with_cxx11_string(void* ctor, void* self, const SourceLocation& where, const char* text, size_t size) {
  using Ctor = void (*)(void*, SourceLocation, std::string);
  reinterpret_cast<Ctor>(ctor)(self, where, std::string(text, size));
}

}  // namespace vta::c10_oom
