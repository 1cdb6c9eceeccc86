// Calling a c10 constructor `(SourceLocation, std::string)` in either std::string ABI.
//
// Owns: SourceLocation's layout, and one plain function per std::string ABI that builds the
// string argument and makes the call. Each is defined in its own translation unit, which fixes
// its ABI by defining _GLIBCXX_USE_CXX11_ABI before any include (libstdc++'s dual-ABI
// mechanism): c10_string_cxx11_abi.cpp (torch 2.7+) and c10_string_old_abi.cpp (torch 2.3-2.6).
// Invariants: nothing declared here names std::string, so this header means the same in every
// translation unit whatever its ABI; a function whose k*String flag is false is never called
// (a libstdc++ built without the dual ABI ignores the define: that file then has the other ABI).
#pragma once

#include <cstddef>
#include <cstdint>

namespace vta::c10_oom {

// c10::SourceLocation (c10/util/StringUtil.h), passed by value: the same in every torch 2.x.
struct SourceLocation {
  const char* function;
  const char* file;
  uint32_t line;
};

// ctor(self, where, std::string(text, size)), where `ctor` is the address of an exported c10
// complete-object constructor (C1) taking (SourceLocation, std::string). What it throws passes.
void construct_with_cxx11_string(void* ctor, void* self, const SourceLocation& where, const char* text, size_t size);
void construct_with_old_string(void* ctor, void* self, const SourceLocation& where, const char* text, size_t size);

extern const bool kHasCxx11String;  // construct_with_cxx11_string passes a new-ABI std::string
extern const bool kHasOldString;    // construct_with_old_string passes an old-ABI (COW) std::string

}  // namespace vta::c10_oom
