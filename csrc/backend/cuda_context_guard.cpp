// CudaContextGuard over the driver table (cuda_context_guard.hpp).
//
// Owns: nothing beyond the guard's two words. Invariant: the driver is asked only through
// driver_api(), the one load of libcuda.
#include "backend/cuda_context_guard.hpp"

#include "backend/cuda_driver_api.hpp"

namespace vta {

CudaContextGuard::CudaContextGuard(bool cuda) {
  if (!cuda) return;
  const cu::DriverApi* api = cu::driver_api(nullptr);
  cu::CUcontext saved = nullptr;
  if (!api || api->cuCtxGetCurrent(&saved) != cu::CUDA_SUCCESS) return;
  api_ = api;
  saved_ = saved;
}

CudaContextGuard::~CudaContextGuard() {
  if (!api_) return;
  auto* api = static_cast<const cu::DriverApi*>(api_);
  auto saved = static_cast<cu::CUcontext>(saved_);
  cu::CUcontext now = nullptr;
  if (api->cuCtxGetCurrent(&now) == cu::CUDA_SUCCESS && now != saved) api->cuCtxSetCurrent(saved);
}

}  // namespace vta
