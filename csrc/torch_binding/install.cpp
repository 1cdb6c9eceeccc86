// The torch-native binding's entry points: the extern "C" functions vtalloc's Python side
// (allocator/torch/binding_build.py) calls through ctypes to install VtaAllocator as torch's allocator.
//
// Owns: the one VtaAllocator of the process (a shared_ptr that is never destroyed: torch keeps
// calling it during its own static destruction), and this thread's last error message.
// Invariants:
//  - No exception leaves these functions: every path returns a status (VTA_OK or VTA_ERR_*)
//    and, on failure, leaves a message for vta_torch_binding_last_error() on this thread.
//  - Installing checks VTA_TORCH_NATIVE_ABI against the core library's, and refuses when
//    torch's current allocator is already initialized (CUDA memory was allocated): what torch's
//    own change_current_allocator refuses; installing twice is a no-op.
#include "torch_binding/vta_allocator.hpp"

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <exception>
#include <string>

#define VTA_BINDING_API extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string last_error;
std::mutex install_mutex;
std::shared_ptr<vta_torch::VtaAllocator>* installed = nullptr;  // leaked on purpose, see above

vta_status_t fail(vta_status_t status, std::string message) {
  last_error = std::move(message);
  return status;
}

}  // namespace

VTA_BINDING_API const char* vta_torch_binding_last_error(void) { return last_error.c_str(); }

// The ABI this binding was compiled against (VTA_TORCH_NATIVE_ABI) and the torch version
// (major * 100 + minor) whose headers it was compiled with.
VTA_BINDING_API int32_t vta_torch_binding_abi(void) { return VTA_TORCH_NATIVE_ABI; }
VTA_BINDING_API int32_t vta_torch_binding_torch_version(void) { return TORCH_BINDING_VERSION; }

// 1 once this binding is torch's allocator in this process.
VTA_BINDING_API int32_t vta_torch_binding_installed(void) {
  std::lock_guard<std::mutex> lock(install_mutex);
  return installed != nullptr ? 1 : 0;
}

VTA_BINDING_API vta_status_t vta_torch_binding_install(void) {
  try {
    std::lock_guard<std::mutex> lock(install_mutex);
    if (installed != nullptr) return VTA_OK;
    const int32_t core_abi = vta_torch_native_abi();
    if (core_abi != VTA_TORCH_NATIVE_ABI) {
      return fail(VTA_ERR_INVALID_ARGUMENT, "ABI mismatch: this binding was built for vtalloc's torch-native ABI " +
                                                std::to_string(VTA_TORCH_NATIVE_ABI) + ", the core library has " +
                                                std::to_string(core_abi) + " (rebuild the binding)");
    }
    auto current = torch::cuda::CUDAPluggableAllocator::getCurrentAllocator();
    if (current != nullptr && current->initialized()) {
      return fail(VTA_ERR_INVALID_ARGUMENT,
                  "PyTorch's CUDA allocator (" + current->name() +
                      ") is already initialized (CUDA memory was allocated): call "
                      "vtalloc.allocator.torch.enable() before the first CUDA tensor");
    }
    auto allocator = std::make_shared<vta_torch::VtaAllocator>();
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    installed = new std::shared_ptr<vta_torch::VtaAllocator>(std::move(allocator));
    return VTA_OK;
  } catch (const std::exception& e) {
    return fail(VTA_ERR_INTERNAL, std::string("installing vtalloc as torch's allocator failed: ") + e.what());
  } catch (...) {
    return fail(VTA_ERR_INTERNAL, "installing vtalloc as torch's allocator failed: unknown exception");
  }
}
