// CudaContextGuard: the calling thread's current CUDA context, restored on scope exit.
//
// Owns: the context that was current when the guard was made. The cuda backend makes its own
// device's primary context current and leaves it so; a caller whose own caller must not see
// its context change (the torch shim: torch tracks the current device) wraps its work in one.
// Invariants: a disarmed guard (cuda == false) never touches, nor loads, the driver; an armed
// one restores only when the context changed, and its destructor never throws.
#pragma once

namespace vta {

class CudaContextGuard {
 public:
  explicit CudaContextGuard(bool cuda);
  ~CudaContextGuard();
  CudaContextGuard(const CudaContextGuard&) = delete;
  CudaContextGuard& operator=(const CudaContextGuard&) = delete;

 private:
  const void* api_ = nullptr;  // the driver table (cu::DriverApi) while armed
  void* saved_ = nullptr;      // the context current at construction (cu::CUcontext)
};

}  // namespace vta
