// The run-time binding to c10::OutOfMemoryError (c10_oom.hpp), its checks, and the throw.
//
// Owns: the search of torch's loaded libraries for the mangled symbols of each route, the
// checks a route must pass before use, the immortal binding once one is made, and the thrown
// object's life (an __cxa_allocate_exception buffer that the C++ runtime frees).
// Invariants: a library handle is kept open only by a binding that uses it (torch never
// unloads these); the thrown object starts with std::exception (c10::Error derives from it
// alone), so destroy_thrown runs its virtual destructor through that base.
#include "torch/c10_oom.hpp"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <typeinfo>
#include <vector>

#include "backend/status.hpp"
#include "torch/c10_string_call.hpp"

namespace vta::c10_oom {
namespace {

// The libraries of torch that may define the symbols, by soname, in the order searched.
constexpr const char* kLibraries[] = {"libc10.so", "libc10_cuda.so", "libtorch_python.so", "libtorch_cpu.so",
                                      "libtorch_cuda.so"};
// Where torch's own `catch (const c10::OutOfMemoryError&)` that makes the Python exception lives.
constexpr const char* kTranslatingLibrary = "libtorch_python.so";

struct AbiSymbols {
  Abi abi;
  const char* oom_ctor;    // c10::OutOfMemoryError::OutOfMemoryError(SourceLocation, std::string), C1
  const char* error_ctor;  // c10::Error::Error(SourceLocation, std::string), C1
};
constexpr AbiSymbols kAbis[] = {
    {Abi::cxx11,
     "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
     "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"},
    {Abi::old, "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationESs", "_ZN3c105ErrorC1ENS_14SourceLocationESs"},
};
constexpr const char* kOomTypeInfo = "_ZTIN3c1016OutOfMemoryErrorE";
constexpr const char* kOomVtable = "_ZTVN3c1016OutOfMemoryErrorE";
constexpr const char* kErrorTypeInfo = "_ZTIN3c105ErrorE";
constexpr const char* kErrorName = "N3c105ErrorE";
// sizeof(c10::OutOfMemoryError) is 128 in torch 2.13 (less with the old ABI); 8x room.
constexpr size_t kExceptionBytes = 1024;

// The file name of the loaded object that holds `address` (dladdr).
std::string file_of(const void* address) {
  Dl_info info{};
  if (!dladdr(address, &info) || !info.dli_fname) return "?";
  const char* slash = std::strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

struct Symbol {
  void* address = nullptr;
  std::string library;  // the file that defines it (dladdr), not the handle it was found through
  explicit operator bool() const { return address != nullptr; }
};

// The torch libraries already in the process, opened with RTLD_NOLOAD; closed again on
// destruction unless keep() was called.
class LoadedLibraries {
 public:
  LoadedLibraries() {
    for (const char* name : kLibraries)
      if (void* handle = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) libs_.push_back({name, handle});
  }
  ~LoadedLibraries() {
    if (!kept_)
      for (const Lib& lib : libs_) dlclose(lib.handle);
  }
  LoadedLibraries(const LoadedLibraries&) = delete;
  LoadedLibraries& operator=(const LoadedLibraries&) = delete;

  void keep() { kept_ = true; }

  bool has(const char* soname) const {
    for (const Lib& lib : libs_)
      if (std::strcmp(lib.name, soname) == 0) return true;
    return false;
  }

  // The first definition of `symbol` in the search order, `first` (a soname) searched first.
  Symbol find(const char* symbol, const char* first = nullptr) const {
    void* address = nullptr;
    for (const Lib& lib : libs_)
      if (first && std::strcmp(lib.name, first) == 0) address = dlsym(lib.handle, symbol);
    for (size_t i = 0; i < libs_.size() && !address; ++i) address = dlsym(libs_[i].handle, symbol);
    return Symbol{address, address ? file_of(address) : std::string()};
  }

  // Whether some library's definition of `symbol` is at `address`.
  bool defines(const char* symbol, const void* address) const {
    for (const Lib& lib : libs_)
      if (dlsym(lib.handle, symbol) == address) return true;
    return false;
  }

  std::string names() const {
    std::string out;
    for (const Lib& lib : libs_) out += (out.empty() ? "" : ", ") + std::string(lib.name);
    return out;
  }

 private:
  struct Lib {
    const char* name;
    void* handle;
  };
  std::vector<Lib> libs_;
  bool kept_ = false;
};

struct Binding {
  Route route = Route::none;
  Abi abi = Abi::none;
  void* ctor = nullptr;                  // OutOfMemoryError's constructor, or c10::Error's (base+vtable)
  void* const* vptr = nullptr;           // base+vtable: OutOfMemoryError's vtable address point
  const std::type_info* type = nullptr;  // OutOfMemoryError's typeinfo, thrown with the object
  std::string libraries;
};

bool abi_built(Abi abi) { return abi == Abi::cxx11 ? kHasCxx11String : kHasOldString; }

const char* abi_name(Abi abi) { return abi == Abi::cxx11 ? "C++11" : "old (copy-on-write)"; }

// "a, b, c" without repeats.
std::string joined(std::initializer_list<std::string> names) {
  std::vector<std::string> seen;
  std::string out;
  for (const std::string& name : names) {
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
    out += (seen.empty() ? "" : ", ") + name;
    seen.push_back(name);
  }
  return out;
}

// Route "constructor": torch exports OutOfMemoryError(SourceLocation, std::string).
std::optional<Binding> by_constructor(const LoadedLibraries& libs, std::string* why) {
  for (const AbiSymbols& names : kAbis) {
    Symbol ctor = libs.find(names.oom_ctor);
    if (!ctor) continue;
    Symbol type = libs.find(kOomTypeInfo, ctor.library.c_str());
    if (!type) {
      *why = "c10::OutOfMemoryError's constructor is exported by " + ctor.library + " but not its typeinfo";
    } else if (!abi_built(names.abi)) {
      *why = std::string("torch's constructor takes the ") + abi_name(names.abi) +
             " std::string, which the libstdc++ vtalloc was built with lacks";
    } else {
      return Binding{Route::constructor, names.abi, ctor.address, nullptr,
                     static_cast<const std::type_info*>(type.address), joined({ctor.library, type.library})};
    }
    return std::nullopt;
  }
  *why = "no c10::OutOfMemoryError(SourceLocation, std::string) constructor is exported";
  return std::nullopt;
}

// Route "base+vtable": c10::Error's constructor, then OutOfMemoryError's vtable, once the vtable
// and its typeinfo show that OutOfMemoryError derives from c10::Error alone, at offset 0.
std::optional<Binding> by_base_and_vtable(const LoadedLibraries& libs, std::string* why) {
  const AbiSymbols* names = nullptr;
  Symbol base;
  for (const AbiSymbols& n : kAbis)
    if (!base && (base = libs.find(n.error_ctor))) names = &n;
  Symbol vtable = libs.find(kOomVtable);
  if (!base || !vtable) {
    *why = std::string("no ") + (base ? "c10::OutOfMemoryError vtable" : "c10::Error(SourceLocation, std::string) "
                                                                         "constructor") + " is exported";
    return std::nullopt;
  }
  auto* slots = static_cast<void* const*>(vtable.address);  // [offset-to-top, typeinfo, virtuals...]
  const auto* type = static_cast<const std::type_info*>(slots[1]);
  auto single_base = [&] {  // asked only of a typeinfo that is one
    const auto* si = dynamic_cast<const abi::__si_class_type_info*>(type);
    return si && std::strcmp(si->__base_type->name(), kErrorName) == 0;
  };
  if (reinterpret_cast<intptr_t>(slots[0]) != 0)
    *why = "c10::OutOfMemoryError's vtable (" + vtable.library + ") has a non-zero offset-to-top";
  else if (!libs.defines(kOomTypeInfo, type))
    *why = "c10::OutOfMemoryError's vtable (" + vtable.library + ") does not point at its exported typeinfo";
  else if (!single_base())
    *why = "c10::OutOfMemoryError's typeinfo does not say it derives from c10::Error alone";
  else if (!abi_built(names->abi))
    *why = std::string("torch's c10::Error constructor takes the ") + abi_name(names->abi) +
           " std::string, which the libstdc++ vtalloc was built with lacks";
  else
    return Binding{Route::base_vtable, names->abi, base.address, slots + 2, type,
                   joined({base.library, vtable.library, file_of(type)})};
  return std::nullopt;
}

// `only`: Route::none tries the routes in order of preference, else that route alone.
std::optional<Binding> resolve(const LoadedLibraries& libs, Route only, std::string* why) {
  if (!libs.has("libc10.so")) {
    *why = "libc10.so is not loaded (import torch first)";
    return std::nullopt;
  }
  std::string no_ctor, no_vtable;
  if (only != Route::base_vtable)
    if (auto b = by_constructor(libs, &no_ctor)) return b;
  if (only != Route::constructor)
    if (auto b = by_base_and_vtable(libs, &no_vtable)) return b;
  *why = no_ctor + (no_ctor.empty() || no_vtable.empty() ? "" : "; ") + no_vtable + " (searched " + libs.names() + ")";
  return std::nullopt;
}

struct State {
  std::mutex mu;  // one attempt at a time
  std::atomic<const Binding*> bound{nullptr};
  std::string reason = "no attempt yet";  // why the last attempt failed
};

State& state() {
  static State* s = new State();  // immortal: torch may allocate (and fail) during static destruction
  return *s;
}

// The binding, or null (then *why, when given, says why not).
const Binding* current(std::string* why) {
  State& s = state();
  if (const Binding* b = s.bound.load(std::memory_order_acquire)) return b;
  std::lock_guard<std::mutex> lk(s.mu);
  if (const Binding* b = s.bound.load(std::memory_order_relaxed)) return b;
  LoadedLibraries libs;
  std::string reason;
  if (auto b = resolve(libs, Route::none, &reason)) {
    libs.keep();
    const Binding* made = new Binding(std::move(*b));  // immortal, like the libraries it points into
    s.bound.store(made, std::memory_order_release);
    return made;
  }
  s.reason = std::move(reason);
  if (why) *why = s.reason;
  return nullptr;
}

void destroy_thrown(void* object) { static_cast<std::exception*>(object)->~exception(); }

[[noreturn]] void throw_through(const Binding& b, const std::string& message) {
  void* object = abi::__cxa_allocate_exception(kExceptionBytes);
  try {
    const SourceLocation where{"vta_torch_alloc", __FILE__, static_cast<uint32_t>(__LINE__)};
    if (b.abi == Abi::old)
      construct_with_old_string(b.ctor, object, where, message.data(), message.size());
    else
      construct_with_cxx11_string(b.ctor, object, where, message.data(), message.size());
  } catch (...) {
    abi::__cxa_free_exception(object);
    throw;
  }
  // c10::Error's constructor left its own vtable; OutOfMemoryError's inherited one would now
  // set OutOfMemoryError's, and do nothing else (no member to construct).
  if (b.route == Route::base_vtable) *static_cast<void* const**>(object) = b.vptr;
  abi::__cxa_throw(object, const_cast<std::type_info*>(b.type), destroy_thrown);
}

// What the C++ runtime does to find a handler of type `handler` for the thrown object.
bool would_catch(const std::type_info* handler, const std::type_info* thrown, const void* object) {
  void* adjusted = const_cast<void*>(object);
  return handler && thrown && handler->__do_catch(thrown, &adjusted, 1);
}

}  // namespace

Report binding() {
  Report r;
  if (const Binding* b = current(&r.reason)) {
    r.route = b->route;
    r.abi = b->abi;
    r.libraries = b->libraries;
  }
  return r;
}

void throw_oom(const std::string& message) {
  const Binding* b = nullptr;
  try {
    b = current(nullptr);
  } catch (const std::exception&) {  // out of host memory while binding: the fallback will do
  }
  if (b) throw_through(*b, message);
  throw OutOfMemoryFallback(message);
}

SelfTest selftest(const std::string& message, Route route) {
  LoadedLibraries libs;  // open until the test ends: a forced route points into them
  std::optional<Binding> forced;
  if (route != Route::none) {
    std::string why;
    forced = resolve(libs, route, &why);
    if (!forced) vta::fail(VTA_ERR_BACKEND_UNAVAILABLE, "this route does not bind here: " + why);
  }
  const Binding* b = forced ? &*forced : current(nullptr);
  SelfTest out;
  try {
    if (b) throw_through(*b, message);
    throw OutOfMemoryFallback(message);
  } catch (const std::exception& e) {
    out.type_name = typeid(e).name();
    out.what = e.what();
    const std::type_info* thrown = abi::__cxa_current_exception_type();
    const void* object = dynamic_cast<const void*>(&e);
    Symbol oom = libs.find(kOomTypeInfo, kTranslatingLibrary);
    Symbol error = libs.find(kErrorTypeInfo, kTranslatingLibrary);
    out.caught_as_oom = would_catch(static_cast<const std::type_info*>(oom.address), thrown, object);
    out.caught_as_error = would_catch(static_cast<const std::type_info*>(error.address), thrown, object);
  }
  return out;
}

}  // namespace vta::c10_oom
