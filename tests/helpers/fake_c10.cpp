// A stand-in libc10.so for tests of the shim's binding to c10::OutOfMemoryError
// (csrc/torch/c10_oom.cpp) in shapes the installed torch does not have. Built by
// tests/test_torch_shim.py with -Wl,-soname,libc10.so and loaded before torch is imported.
//
// It declares what torch 2.3-2.12 declare: c10::Error(SourceLocation, std::string) exported,
// and OutOfMemoryError with inherited constructors (so no OutOfMemoryError constructor is
// exported; its vtable and typeinfo are, as weak symbols). Compile with
// -D_GLIBCXX_USE_CXX11_ABI=0 for the old std::string (torch 2.3-2.6), and:
//   -DFAKE_SECOND_BASE  OutOfMemoryError derives from c10::Error and another class (refused);
//   -DFAKE_NO_OOM       no OutOfMemoryError at all (nothing to bind).
// what() is the message and " @" + the SourceLocation's function: both arguments arrived.
#include <exception>
#include <string>

namespace c10 {

struct SourceLocation {
  const char* function;
  const char* file;
  unsigned line;
};

class Error : public std::exception {
 public:
  Error(SourceLocation where, std::string msg);
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

Error::Error(SourceLocation where, std::string msg) : what_(std::move(msg) + " @" + where.function) {}

#ifndef FAKE_NO_OOM
#ifdef FAKE_SECOND_BASE
struct Tag {
  virtual ~Tag() = default;
};
class OutOfMemoryError : public Error, public Tag {
  using Error::Error;
};
#else
class OutOfMemoryError : public Error {
  using Error::Error;
};
#endif

// Uses the class, so its vtable and typeinfo are emitted (weak, exported) as in torch.
std::exception* make_out_of_memory_error() { return new OutOfMemoryError(SourceLocation{"", "", 0}, ""); }
#endif

}  // namespace c10
