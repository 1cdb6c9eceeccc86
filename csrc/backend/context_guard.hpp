// ContextGuard: the calling thread's current context, restored on scope exit, for a backend
// kind that needs a context (BackendCapabilities::needs_context: cuda).
//
// Owns: the context that was current when the guard was made. Such a backend makes its own
// device's context current and leaves it so; a caller whose own caller must not see its
// context change (the torch shim: torch tracks the current device) wraps its work in one.
// Invariants: a guard of no kind (null) or of a kind that needs no context does nothing (nor
// loads a driver); an armed one restores only when the context changed (the kind's hooks), and
// its destructor never throws.
#pragma once

#include "backend/backend_registry.hpp"

namespace vta {

class ContextGuard {
 public:
  explicit ContextGuard(const BackendInfo* backend) {
    if (backend && backend->capabilities.needs_context && backend->save_context(&saved_)) restore_ = backend->restore_context;
  }
  ~ContextGuard() {
    if (restore_) restore_(saved_);
  }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  void (*restore_)(void*) = nullptr;  // the kind's restore hook while armed
  void* saved_ = nullptr;             // the context current at construction
};

}  // namespace vta
