// The slice of the CUDA driver API the cuda backend calls, declared here so that the
// library builds with a plain C++ compiler: no CUDA headers, no nvcc, no link to libcuda.
//
// Owns: ABI-compatible type declarations and the table of function pointers resolved at run
// time with dlopen("libcuda.so.1") + cuGetProcAddress. Values and layouts follow the CUDA 12/13
// driver ABI (cuda.h); only what the backend layer uses is declared. The only dlopen of
// libcuda in the library.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vta::cu {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;

constexpr int CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102;
constexpr int CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103;
constexpr int CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID = 134;
constexpr int CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 141;

constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 0x1;
constexpr int CU_MEM_HANDLE_TYPE_NONE = 0x0;
constexpr int CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1;
constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 0x1;
constexpr int CU_MEM_LOCATION_TYPE_HOST_NUMA = 0x3;
constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;
constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0;
constexpr int CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1;
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x1;
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;

struct CUmemLocation {
  int type;
  int id;
};

struct CUmemAllocationProp {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;
};

static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");

// X-macro: name, return, parameters. Resolved by name through cuGetProcAddress.
#define VTA_CUDA_DRIVER_FUNCTIONS(_)                                                              \
  _(cuInit, (unsigned int))                                                                       \
  _(cuDriverGetVersion, (int*))                                                                   \
  _(cuGetErrorName, (CUresult, const char**))                                                     \
  _(cuGetErrorString, (CUresult, const char**))                                                   \
  _(cuDeviceGetCount, (int*))                                                                     \
  _(cuDeviceGet, (CUdevice*, int))                                                                \
  _(cuDeviceGetAttribute, (int*, int, CUdevice))                                                  \
  _(cuDeviceGetName, (char*, int, CUdevice))                                                      \
  _(cuDevicePrimaryCtxRetain, (CUcontext*, CUdevice))                                             \
  _(cuDevicePrimaryCtxRelease, (CUdevice))                                                        \
  _(cuCtxGetCurrent, (CUcontext*))                                                                \
  _(cuCtxSetCurrent, (CUcontext))                                                                 \
  _(cuCtxSynchronize, (void))                                                                     \
  _(cuMemGetInfo, (size_t*, size_t*))                                                             \
  _(cuMemGetAllocationGranularity, (size_t*, const CUmemAllocationProp*, int))                    \
  _(cuMemAddressReserve, (CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long))         \
  _(cuMemAddressFree, (CUdeviceptr, size_t))                                                      \
  _(cuMemCreate, (CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)) \
  _(cuMemRelease, (CUmemGenericAllocationHandle))                                                 \
  _(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))    \
  _(cuMemUnmap, (CUdeviceptr, size_t))                                                            \
  _(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc*, size_t))                        \
  _(cuMemExportToShareableHandle, (void*, CUmemGenericAllocationHandle, int, unsigned long long)) \
  _(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle*, void*, int))                  \
  _(cuMemcpyAsync, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                  \
  _(cuMemHostAlloc, (void**, size_t, unsigned int))                                               \
  _(cuMemFreeHost, (void*))                                                                       \
  _(cuStreamCreate, (CUstream*, unsigned int))                                                    \
  _(cuStreamDestroy, (CUstream))                                                                  \
  _(cuStreamSynchronize, (CUstream))                                                              \
  _(cuStreamWaitEvent, (CUstream, CUevent, unsigned int))                                         \
  _(cuStreamIsCapturing, (CUstream, int*))                                                        \
  _(cuEventCreate, (CUevent*, unsigned int))                                                      \
  _(cuEventDestroy, (CUevent))                                                                    \
  _(cuEventRecord, (CUevent, CUstream))                                                           \
  _(cuEventQuery, (CUevent))                                                                      \
  _(cuEventSynchronize, (CUevent))

struct DriverApi {
#define VTA_DECLARE_FN(name, params) CUresult(*name) params = nullptr;
  VTA_CUDA_DRIVER_FUNCTIONS(VTA_DECLARE_FN)
#undef VTA_DECLARE_FN
  // Optional (nullptr when the driver lacks it): the calling thread's stream-capture mode.
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;
};

enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1, CU_STREAM_CAPTURE_MODE_RELAXED = 2 };

// Load libcuda and resolve every function once per process. Returns nullptr and sets
// *why when the driver is missing or too old; never throws.
const DriverApi* driver_api(const char** why);

}  // namespace vta::cu
