// The out-of-memory exception of the torch shim: a real c10::OutOfMemoryError, which torch's
// bindings turn into torch.OutOfMemoryError, bound at run time from the torch in the process.
//
// Owns: the process-wide binding to c10 (which route, which std::string ABI, which libraries)
// and throwing through it. Routes, in order of preference:
//  - constructor: an exported c10::OutOfMemoryError(SourceLocation, std::string) (torch 2.13+);
//  - base+vtable: c10::Error's exported constructor, then OutOfMemoryError's vtable installed,
//    which is what its inherited constructor does (it adds no data member: torch 2.3-2.12).
// Without either, the fallback OutOfMemoryFallback, a std::bad_alloc (Python: RuntimeError).
// Invariants: only libraries torch already loaded are searched (RTLD_NOLOAD: never loads one);
// a route is used only after its checks passed; once bound, the binding is immortal and never
// looked up again; until then every call tries again (torch may be imported later).
#pragma once

#include <cstdint>
#include <new>
#include <string>

namespace vta::c10_oom {

enum class Route : int32_t { none = 0, constructor = 1, base_vtable = 2 };  // VTA_TORCH_OOM_ROUTE_*
enum class Abi : int32_t { none = 0, cxx11 = 1, old = 2 };                  // VTA_TORCH_OOM_ABI_*

// What an out-of-memory throws when no route binds.
class OutOfMemoryFallback : public std::bad_alloc {
 public:
  explicit OutOfMemoryFallback(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

struct Report {
  Route route = Route::none;
  Abi abi = Abi::none;
  std::string libraries;  // where the symbols in use came from, comma-separated
  std::string reason;     // why no route bound ("" when one did)
};

// The binding in force, binding first when there is none yet.
Report binding();

// Throw c10::OutOfMemoryError(message) through the binding, or the fallback.
[[noreturn]] void throw_oom(const std::string& message);

struct SelfTest {
  std::string type_name;         // typeid of the caught object (its vtable's typeinfo)
  std::string what;
  bool caught_as_oom = false;    // a handler for c10::OutOfMemoryError would catch it
  bool caught_as_error = false;  // a handler for c10::Error would catch it
};

// Throw as throw_oom does, through `route` (none: the binding in force, or the fallback; else
// that route alone: VTA_ERR_BACKEND_UNAVAILABLE when it does not bind here), catch it, report.
SelfTest selftest(const std::string& message, Route route);

}  // namespace vta::c10_oom
