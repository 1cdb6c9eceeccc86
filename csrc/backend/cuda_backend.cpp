// The cuda backend: the driver seam on the CUDA virtual memory management API.
//
// Owns: the one load of the driver (driver_api()), a retained primary context of one device,
// the allocation properties used for every page (device-located, POSIX-fd exportable where
// the device supports it), the capture state of a stream, the thread's current context saved
// and restored (ContextGuard's hooks) and its stream-capture mode relaxed and restored, the
// kind's registry entry (cuda_backend_info), and the
// translation of CUresult into Status. The driver is loaded at run time, so this file
// builds without CUDA and, on a machine without a driver, make_cuda_backend() reports
// VTA_ERR_BACKEND_UNAVAILABLE instead of failing to load.
// Invariant: every call runs with this backend's context current on the calling thread.
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <string>

#include "backend/backend.hpp"
#include "backend/backend_registry.hpp"
#include "backend/counters.hpp"
#include "backend/cuda_driver_api.hpp"

namespace vta {
namespace cu {

namespace {
DriverApi g_api;
const char* g_why = nullptr;
std::once_flag g_once;

using GetProcV2 = CUresult (*)(const char*, void**, int, unsigned long long, int*);
using GetProcV1 = CUresult (*)(const char*, void**, int, unsigned long long);

void load_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    g_why = "no CUDA driver: libcuda.so.1 could not be loaded";
    return;
  }
  auto v2 = reinterpret_cast<GetProcV2>(dlsym(lib, "cuGetProcAddress_v2"));
  auto v1 = reinterpret_cast<GetProcV1>(dlsym(lib, "cuGetProcAddress"));
  if (!v2 && !v1) {
    g_why = "CUDA driver too old: cuGetProcAddress is missing (need CUDA 11.3 or newer)";
    return;
  }
  constexpr int kVersion = 12000;  // ask for the CUDA 12 ABI of each entry point
  bool ok = true;
  auto resolve = [&](const char* name, void** slot) {
    CUresult r = v2 ? v2(name, slot, kVersion, 0, nullptr) : v1(name, slot, kVersion, 0);
    if (r != CUDA_SUCCESS || !*slot) ok = false;
  };
#define VTA_RESOLVE_FN(name, params) resolve(#name, reinterpret_cast<void**>(&g_api.name));
  VTA_CUDA_DRIVER_FUNCTIONS(VTA_RESOLVE_FN)
#undef VTA_RESOLVE_FN
  if (!ok) {
    g_why = "CUDA driver too old: a virtual memory management entry point is missing (need CUDA 12)";
    return;
  }
  // Optional: without it, allocation during capture goes on in the thread's current mode.
  void* exchange = nullptr;
  resolve("cuThreadExchangeStreamCaptureMode", &exchange);
  g_api.cuThreadExchangeStreamCaptureMode = reinterpret_cast<CUresult (*)(int*)>(exchange);
}
}  // namespace

const DriverApi* driver_api(const char** why) {
  std::call_once(g_once, load_driver);
  if (g_why) {
    if (why) *why = g_why;
    return nullptr;
  }
  return &g_api;
}

}  // namespace cu

namespace {

// Backend::stream_is_capturing for cuda: asked on the calling thread's context.
Status cuda_stream_is_capturing(StreamHandle stream, bool* capturing) {
  *capturing = false;
  const cu::DriverApi* api = cu::driver_api(nullptr);
  if (!api) return Status::ok();  // no driver: nothing can be capturing
  int status = cu::CU_STREAM_CAPTURE_STATUS_NONE;
  if (api->cuStreamIsCapturing(reinterpret_cast<cu::CUstream>(stream), &status) == cu::CUDA_SUCCESS)
    *capturing = status != cu::CU_STREAM_CAPTURE_STATUS_NONE;
  return Status::ok();
}

// ContextGuard's hooks: the calling thread's current context (false, nothing saved, without a
// driver), set back only when it changed.
bool cuda_save_context(void** saved) {
  const cu::DriverApi* api = cu::driver_api(nullptr);
  cu::CUcontext current = nullptr;
  if (!api || api->cuCtxGetCurrent(&current) != cu::CUDA_SUCCESS) return false;
  *saved = current;
  return true;
}

void cuda_restore_context(void* saved) {
  const cu::DriverApi* api = cu::driver_api(nullptr);
  if (!api) return;
  auto context = static_cast<cu::CUcontext>(saved);
  cu::CUcontext now = nullptr;
  if (api->cuCtxGetCurrent(&now) == cu::CUDA_SUCCESS && now != context) api->cuCtxSetCurrent(context);
}

// cuThreadExchangeStreamCaptureMode for the calling thread: *mode in, the previous mode out
// (CU_STREAM_CAPTURE_MODE_*); false (nothing changed) when the driver lacks it or refuses.
bool cuda_exchange_capture_mode(int* mode) {
  const cu::DriverApi* api = cu::driver_api(nullptr);
  if (!api || !api->cuThreadExchangeStreamCaptureMode) return false;
  return api->cuThreadExchangeStreamCaptureMode(mode) == cu::CUDA_SUCCESS;
}

// The registry's capture-mode hooks: relaxed in, the previous mode kept and set back.
bool cuda_relax_capture_mode(int* previous) {
  int mode = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
  if (!cuda_exchange_capture_mode(&mode)) return false;
  *previous = mode;
  return true;
}

void cuda_restore_capture_mode(int previous) { (void)cuda_exchange_capture_mode(&previous); }

}  // namespace

namespace {

using namespace cu;

// What a cuda backend may do; host pages and export depend on the device (CudaBackend::init).
BackendCapabilities cuda_capabilities() {
  BackendCapabilities c;
  c.device_memory = true;
  c.needs_context = true;
  c.can_capture = true;
  c.host_pages = true;
  c.export_pages = true;
  return c;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const DriverApi* api, int device, CUdevice dev, CUcontext ctx)
      : api_(api), device_(device), dev_(dev), ctx_(ctx) {}

  Status init() {
    int vmm = 0, posix = 0, numa_vmm = 0;
    if (Status s = call("cuDeviceGetAttribute",
                        api_->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev_));
        !s.is_ok())
      return s;
    if (!vmm)
      return Status(VTA_ERR_BACKEND_UNAVAILABLE, "cuda device " + std::to_string(device_) +
                                                     " does not support virtual memory management");
    api_->cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev_);
    if (api_->cuDeviceGetAttribute(&numa_vmm, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                   dev_) != CUDA_SUCCESS)
      numa_vmm = 0;  // attribute unknown to this driver: treat as unsupported
    int numa_id = -1;
    if (api_->cuDeviceGetAttribute(&numa_id, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev_) != CUDA_SUCCESS) numa_id = -1;
    host_numa_id_ = numa_id;
    host_pages_ = numa_vmm && numa_id >= 0;

    prop_ = CUmemAllocationProp{};
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = dev_;
    prop_.requestedHandleTypes = posix ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    exportable_ = posix != 0;
    size_t gran = 0;
    if (Status s = call("cuMemGetAllocationGranularity",
                        api_->cuMemGetAllocationGranularity(&gran, &prop_, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        !s.is_ok())
      return s;
    size_t min_gran = 0;
    api_->cuMemGetAllocationGranularity(&min_gran, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    granularity_ = gran > min_gran ? gran : min_gran;
    size_t free_b = 0, total_b = 0;
    if (Status s = call("cuMemGetInfo", api_->cuMemGetInfo(&free_b, &total_b)); !s.is_ok()) return s;
    // Leave room for the CUDA context, cuBLAS/cuDNN workspaces and other allocators.
    uint64_t margin = total_b / 50 > (512ull << 20) ? total_b / 50 : (512ull << 20);
    default_capacity_ = free_b > margin ? (free_b - margin) / granularity_ * granularity_ : 0;
    return Status::ok();
  }

  ~CudaBackend() override {
    current();
    api_->cuDevicePrimaryCtxRelease(dev_);
  }

  int kind() const override { return VTA_BACKEND_CUDA; }
  const char* name() const override { return "cuda"; }
  int device() const override { return device_; }
  size_t granularity() const override { return granularity_; }
  uint64_t default_capacity() const override { return default_capacity_; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities c = cuda_capabilities();
    c.host_pages = host_pages_;
    c.export_pages = exportable_;
    return c;
  }

  Status reserve(size_t bytes, size_t align, uintptr_t* va) override {
    current();
    CUdeviceptr p = 0;
    Status s = call("cuMemAddressReserve", api_->cuMemAddressReserve(&p, bytes, align, 0, 0));
    if (!s.is_ok()) return s;
    *va = static_cast<uintptr_t>(p);
    global_counters().live_reservations++;
    global_counters().reserved_va_bytes += static_cast<int64_t>(bytes);
    return s;
  }
  Status free_va(uintptr_t va, size_t bytes) override {
    current();
    Status s = call("cuMemAddressFree", api_->cuMemAddressFree(va, bytes));
    if (s.is_ok()) {
      global_counters().live_reservations--;
      global_counters().reserved_va_bytes -= static_cast<int64_t>(bytes);
    }
    return s;
  }
  Status create_page(size_t bytes, PageLocation where, PageHandle* out) override {
    current();
    CUmemAllocationProp prop = prop_;
    if (where == PageLocation::host) {
      if (!host_pages_) return Status(VTA_ERR_BACKEND_UNAVAILABLE, "host-located VMM pages are not supported here");
      prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
      prop.location.id = host_numa_id_;
      prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    }
    CUmemGenericAllocationHandle h = 0;
    Status s = call("cuMemCreate", api_->cuMemCreate(&h, bytes, &prop, 0));
    if (!s.is_ok()) return s;
    *out = h;
    global_counters().live_pages++;
    global_counters().live_page_bytes += static_cast<int64_t>(bytes);
    sizes_lock_.lock();
    sizes_[h] = bytes;
    sizes_lock_.unlock();
    return s;
  }
  Status release_page(PageHandle page) override {
    current();
    Status s = call("cuMemRelease", api_->cuMemRelease(page));
    if (s.is_ok()) {
      std::lock_guard<std::mutex> lk(sizes_lock_);
      auto it = sizes_.find(page);
      global_counters().live_pages--;
      if (it != sizes_.end()) {
        global_counters().live_page_bytes -= static_cast<int64_t>(it->second);
        sizes_.erase(it);
      }
    }
    return s;
  }
  Status map(uintptr_t va, size_t bytes, PageHandle page) override {
    current();
    Status s = call("cuMemMap", api_->cuMemMap(va, bytes, 0, page, 0));
    if (s.is_ok()) {
      std::lock_guard<std::mutex> lk(sizes_lock_);
      mappings_[va] = bytes;
      global_counters().live_mappings++;
    }
    return s;
  }
  Status unmap(uintptr_t va, size_t bytes) override {
    current();
    Status s = call("cuMemUnmap", api_->cuMemUnmap(va, bytes));
    if (s.is_ok()) {
      std::lock_guard<std::mutex> lk(sizes_lock_);
      for (auto it = mappings_.lower_bound(va); it != mappings_.end() && it->first < va + bytes;) {
        it = mappings_.erase(it);
        global_counters().live_mappings--;
      }
    }
    return s;
  }
  Status set_access(uintptr_t va, size_t bytes) override {
    current();
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = dev_;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return call("cuMemSetAccess", api_->cuMemSetAccess(va, bytes, &desc, 1));
  }
  Status copy(uintptr_t dst, uintptr_t src, size_t bytes, StreamHandle stream) override {
    current();
    return call("cuMemcpyAsync", api_->cuMemcpyAsync(dst, src, bytes, reinterpret_cast<CUstream>(stream)));
  }
  Status stream_create(StreamHandle* out) override {
    current();
    CUstream s = nullptr;
    Status st = call("cuStreamCreate", api_->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (st.is_ok()) {
      *out = reinterpret_cast<StreamHandle>(s);
      global_counters().live_streams++;
    }
    return st;
  }
  Status stream_destroy(StreamHandle stream) override {
    current();
    Status st = call("cuStreamDestroy", api_->cuStreamDestroy(reinterpret_cast<CUstream>(stream)));
    if (st.is_ok()) global_counters().live_streams--;
    return st;
  }
  Status stream_synchronize(StreamHandle stream) override {
    current();
    return call("cuStreamSynchronize", api_->cuStreamSynchronize(reinterpret_cast<CUstream>(stream)));
  }
  Status device_synchronize() override {
    current();
    return call("cuCtxSynchronize", api_->cuCtxSynchronize());
  }
  Status event_create(EventHandle* out) override {
    current();
    CUevent e = nullptr;
    Status st = call("cuEventCreate", api_->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    if (st.is_ok()) {
      *out = reinterpret_cast<EventHandle>(e);
      global_counters().live_events++;
    }
    return st;
  }
  Status event_destroy(EventHandle event) override {
    current();
    Status st = call("cuEventDestroy", api_->cuEventDestroy(reinterpret_cast<CUevent>(event)));
    if (st.is_ok()) global_counters().live_events--;
    return st;
  }
  Status event_record(EventHandle event, StreamHandle stream) override {
    current();
    return call("cuEventRecord",
                api_->cuEventRecord(reinterpret_cast<CUevent>(event), reinterpret_cast<CUstream>(stream)));
  }
  Status event_query(EventHandle event, bool* complete) override {
    current();
    CUresult r = api_->cuEventQuery(reinterpret_cast<CUevent>(event));
    if (r == CUDA_ERROR_NOT_READY) {
      *complete = false;
      return Status::ok();
    }
    *complete = r == CUDA_SUCCESS;
    return call("cuEventQuery", r);
  }
  Status event_synchronize(EventHandle event) override {
    current();
    return call("cuEventSynchronize", api_->cuEventSynchronize(reinterpret_cast<CUevent>(event)));
  }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override {
    current();
    return call("cuStreamWaitEvent", api_->cuStreamWaitEvent(reinterpret_cast<CUstream>(stream),
                                                             reinterpret_cast<CUevent>(event), 0));
  }
  Status host_alloc_pinned(size_t bytes, void** out) override {
    current();
    Status s = call("cuMemHostAlloc", api_->cuMemHostAlloc(out, bytes, CU_MEMHOSTALLOC_PORTABLE));
    if (s.is_ok()) global_counters().pinned_host_bytes += static_cast<int64_t>(bytes);
    return s;
  }
  Status host_free_pinned(void* ptr, size_t bytes) override {
    current();
    Status s = call("cuMemFreeHost", api_->cuMemFreeHost(ptr));
    if (s.is_ok()) global_counters().pinned_host_bytes -= static_cast<int64_t>(bytes);
    return s;
  }
  Status export_page(PageHandle page, int* fd) override {
    if (!exportable_)
      return Status(VTA_ERR_BACKEND_UNAVAILABLE, "this device cannot export pages as POSIX file descriptors");
    current();
    int out = -1;
    Status s = call("cuMemExportToShareableHandle",
                    api_->cuMemExportToShareableHandle(&out, page, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    if (s.is_ok()) *fd = out;
    return s;
  }
  Status import_page(int fd, size_t bytes, PageHandle* out) override {
    current();
    CUmemGenericAllocationHandle h = 0;
    Status s = call("cuMemImportFromShareableHandle",
                    api_->cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    if (!s.is_ok()) return s;
    *out = h;
    global_counters().live_pages++;
    global_counters().live_page_bytes += static_cast<int64_t>(bytes);
    std::lock_guard<std::mutex> lk(sizes_lock_);
    sizes_[h] = bytes;
    return s;
  }

 private:
  void current() {
    CUcontext cur = nullptr;
    if (api_->cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != ctx_) api_->cuCtxSetCurrent(ctx_);
  }

  Status call(const char* what, CUresult r) const {
    if (r == CUDA_SUCCESS) return Status::ok();
    const char* name = nullptr;
    const char* text = nullptr;
    api_->cuGetErrorName(r, &name);
    api_->cuGetErrorString(r, &text);
    std::string msg = std::string(what) + " failed: " + (name ? name : "CUDA_ERROR") + " (" + std::to_string(r) +
                      "): " + (text ? text : "unknown error");
    return Status(r == CUDA_ERROR_OUT_OF_MEMORY ? VTA_ERR_OUT_OF_MEMORY : VTA_ERR_DRIVER, msg);
  }

  const DriverApi* api_;
  int device_;
  CUdevice dev_;
  CUcontext ctx_;
  CUmemAllocationProp prop_{};
  size_t granularity_ = 0;
  uint64_t default_capacity_ = 0;
  bool exportable_ = false;
  bool host_pages_ = false;
  int host_numa_id_ = -1;
  mutable std::mutex sizes_lock_;
  std::unordered_map<CUmemGenericAllocationHandle, size_t> sizes_;  // page -> bytes (accounting)
  std::map<uintptr_t, size_t> mappings_;                              // va -> bytes (accounting)
};

}  // namespace

static Status make_cuda_backend(const BackendOptions& options, std::unique_ptr<Backend>* out) {
  const char* why = nullptr;
  const DriverApi* api = cu::driver_api(&why);
  if (!api) return Status(VTA_ERR_BACKEND_UNAVAILABLE, why);
  CUresult r = api->cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    api->cuGetErrorName(r, &name);
    return Status(VTA_ERR_BACKEND_UNAVAILABLE,
                  std::string("no usable CUDA device: cuInit failed with ") + (name ? name : std::to_string(r)));
  }
  int count = 0;
  if (api->cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0)
    return Status(VTA_ERR_BACKEND_UNAVAILABLE, "no CUDA device found");
  if (options.device < 0 || options.device >= count)
    return Status(VTA_ERR_BACKEND_UNAVAILABLE, "no CUDA device " + std::to_string(options.device) + " (found " +
                                                   std::to_string(count) + ")");
  CUdevice dev = 0;
  if (api->cuDeviceGet(&dev, options.device) != CUDA_SUCCESS)
    return Status(VTA_ERR_BACKEND_UNAVAILABLE, "cuDeviceGet failed");
  CUcontext ctx = nullptr;
  if (api->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
    return Status(VTA_ERR_BACKEND_UNAVAILABLE, "cannot retain the primary context of the CUDA device");
  CUcontext prev = nullptr;
  api->cuCtxGetCurrent(&prev);
  api->cuCtxSetCurrent(ctx);
  auto backend = std::make_unique<CudaBackend>(api, options.device, dev, ctx);
  Status s = backend->init();
  if (!s.is_ok()) {
    backend.reset();  // releases the primary context
    if (prev) api->cuCtxSetCurrent(prev);
    return s;
  }
  *out = std::move(backend);
  return Status::ok();
}

BackendInfo cuda_backend_info() {
  BackendInfo b;
  b.name = "cuda";
  b.capabilities = cuda_capabilities();
  b.make = make_cuda_backend;
  b.stream_is_capturing = cuda_stream_is_capturing;
  b.save_context = cuda_save_context;
  b.restore_context = cuda_restore_context;
  b.relax_capture_mode = cuda_relax_capture_mode;
  b.restore_capture_mode = cuda_restore_capture_mode;
  return b;
}

}  // namespace vta
