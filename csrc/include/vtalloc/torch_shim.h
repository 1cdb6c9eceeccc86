/* vtalloc's PyTorch shim: the allocate/free pair that torch.cuda.memory.CUDAPluggableAllocator
 * calls, and the C functions vtalloc.allocator.torch uses to configure and inspect it.
 *
 * Owns: one address space per device ordinal (at most VTA_TORCH_MAX_DEVICES), each created on
 * the first allocation for that device with the options given to vta_torch_configure().
 * Invariants:
 *  - vta_torch_alloc / vta_torch_free never call Python and never take the GIL; the fast path
 *    is one atomic load plus the address space's own lock.
 *  - Every function here except vta_torch_alloc returns a status (or nothing) and never lets a
 *    C++ exception out; on failure vta_torch_last_error() holds a message for this thread.
 *  - vta_torch_alloc is called by PyTorch's C++ (never by C or ctypes). When it cannot serve a
 *    request of more than 0 bytes it records the failure (vta_torch_failures) and then, by the
 *    configured policy, either returns NULL (VTA_TORCH_FAIL_RETURN_NULL: what torch's caching
 *    allocator expects from a MemPool allocator; it turns NULL into its own OOM handling) or
 *    throws (VTA_TORCH_FAIL_THROW: what torch needs from its *global* allocator, which never
 *    checks the pointer: a NULL there becomes a tensor at address 0 and a fatal illegal-address
 *    fault). The thrown exception is c10::OutOfMemoryError, bound at run time from the torch
 *    libraries already loaded in the process, so Python sees torch.OutOfMemoryError with
 *    vtalloc's numbers; where it cannot be bound it is a std::bad_alloc (Python: RuntimeError),
 *    and vta_torch_oom_binding() says why.
 *    Unconfigured, the shim uses the default options and VTA_TORCH_FAIL_THROW.
 *  - vta_torch_free never throws and never fails loudly: torch calls it from destructors. A
 *    failure is counted and kept as the device's last failure.
 *  - The per-device spaces are never destroyed at process exit (torch frees tensors during
 *    its own static destruction); vta_torch_release() closes them when nothing is live.
 */
#ifndef VTALLOC_TORCH_SHIM_H
#define VTALLOC_TORCH_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "vtalloc/vtalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VTA_TORCH_MAX_DEVICES 64

enum { VTA_TORCH_FAIL_RETURN_NULL = 0, VTA_TORCH_FAIL_THROW = 1 };
/* What a VTA_TORCH_FAIL_THROW out-of-memory throws in this process right now. */
enum { VTA_TORCH_EXC_C10_OOM = 1, VTA_TORCH_EXC_STD_BAD_ALLOC = 2 };

typedef struct vta_torch_config {
  uint32_t struct_size;          /* sizeof(vta_torch_config_t) */
  uint32_t on_failure;           /* VTA_TORCH_FAIL_* */
  vta_config_t space;            /* options of every per-device space; space.device is ignored */
} vta_torch_config_t;

typedef struct vta_torch_failures {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t alloc_failures;       /* requests vta_torch_alloc could not serve (any reason) */
  uint64_t ooms;                 /* of which: out of memory */
  uint64_t capture_refusals;     /* of which: refused during CUDA graph capture */
  uint64_t free_failures;        /* frees that failed (pointer unknown, driver error) */
  uint64_t deferred_frees;       /* frees parked because their stream was capturing a graph */
  uint64_t last_oom_requested_bytes;
  uint64_t last_oom_capacity_bytes;
  uint64_t last_oom_mapped_bytes;
} vta_torch_failures_t;

VTA_API const char* vta_torch_last_error(void);

/* Set the options of the per-device spaces, in one call: `config` is normalized (as
 * vta_torch_normalize_config says), applied, and what is kept is written to `kept` (may be NULL;
 * written only on success). Allowed while no space exists, or again with the very same options
 * after normalization (a no-op); otherwise VTA_ERR_INVALID_ARGUMENT, and nothing changes. */
VTA_API vta_status_t vta_torch_configure(const vta_torch_config_t* config, vta_torch_config_t* kept);
/* The options in force; *configured = 0 when vta_torch_configure was never called (configured
 * may be NULL). */
VTA_API vta_status_t vta_torch_get_config(vta_torch_config_t* out, int32_t* configured);
/* The options vta_torch_configure would keep for `in`, changing nothing (to compare a request
 * with the options in force before applying it): the one place the shim's defaults are applied
 * (space.device and space.flags zeroed, backend AUTO becomes CUDA: torch hands the pointers to
 * CUDA kernels, so "auto" never falls back to host memory). Refuses what vta_torch_configure
 * refuses for the options themselves (struct_size, on_failure, backend). */
VTA_API vta_status_t vta_torch_normalize_config(const vta_torch_config_t* in, vta_torch_config_t* out);

/* PyTorch's CUDAPluggableAllocator signatures (cudaStream_t is a pointer). */
VTA_API void* vta_torch_alloc(size_t size, int device, void* stream);
VTA_API void vta_torch_free(void* ptr, size_t size, int device, void* stream);

/* Bit i set when device i has a space. */
VTA_API vta_status_t vta_torch_devices(uint64_t* mask);
/* Stats of one device's space; all zero (struct_size set) when the device has none. */
VTA_API vta_status_t vta_torch_stats(int32_t device, vta_stats_t* out);
/* device -1: every device with a space. */
VTA_API vta_status_t vta_torch_reset_peak_stats(int32_t device);
VTA_API vta_status_t vta_torch_trim(int32_t device, uint64_t* out_released_bytes);
/* vta_release_offloaded on the device's space (-1: every device). */
VTA_API vta_status_t vta_torch_release_offloaded(int32_t device, uint32_t flags, uint64_t* out_released_bytes);
/* Residency of the allocation at `address` (a tensor's storage under enable()) on `device`:
 * the eviction engine's calls (vtalloc.h) for the shim's spaces. `stream`/`use_stream` as in
 * vta_restore (OP_PREFETCH: without VTA_RESTORE_WAIT, OP_ENSURE_RESIDENT: with it); `out`
 * receives VTA_RESIDENT/EVICTED/IN_FLIGHT for VTA_TORCH_OP_RESIDENCY. */
enum {
  VTA_TORCH_OP_SET_EVICTABLE = 0, VTA_TORCH_OP_CLEAR_EVICTABLE = 1, VTA_TORCH_OP_OFFLOAD = 2,
  VTA_TORCH_OP_PREFETCH = 3, VTA_TORCH_OP_ENSURE_RESIDENT = 4, VTA_TORCH_OP_RESIDENCY = 5
};
VTA_API vta_status_t vta_torch_residency_op(int32_t device, int32_t op, uint64_t address, uint64_t stream,
                                            int32_t use_stream, int32_t* out);
/* VTA_TORCH_OP_OFFLOAD that also reports *moved: the bytes of the allocation now on pages that are
 * away (a page it shares with an allocation not marked evictable stays resident; vta_offload_bytes). */
VTA_API vta_status_t vta_torch_offload_bytes(int32_t device, uint64_t address, uint64_t* moved);
/* Counters and the last failure message of one device (message may be NULL). */
VTA_API vta_status_t vta_torch_failures(int32_t device, vta_torch_failures_t* out, char* message,
                                        uint64_t message_capacity);
/* Regions under enable() (appended; vtalloc.h "Regions", docs/regions.md). The region tag that the
 * calling thread's torch allocations carry from now on (0: none; both bindings, graph-private pools
 * included), and the one before it in *previous (may be NULL). */
VTA_API vta_status_t vta_torch_set_region(uint32_t region, uint32_t* previous);
/* vta_region_pause / vta_region_resume on device `device`'s space, or on every device's (-1, one
 * after the other: each device's resume is all or nothing, not all of them together); the page
 * bytes moved, summed. */
VTA_API vta_status_t vta_torch_region_pause(int32_t device, uint32_t region, uint32_t flags, uint64_t* out_page_bytes);
VTA_API vta_status_t vta_torch_region_resume(int32_t device, uint32_t region, uint32_t flags, uint64_t* out_page_bytes);
/* vta_regions of one device's space (none: *out_count = 0). */
VTA_API vta_status_t vta_torch_regions(int32_t device, vta_region_info_t* out, uint64_t capacity, uint64_t* out_count);
/* Close every space and forget the configuration. VTA_ERR_INVALID_ARGUMENT (nothing changed)
 * while any allocation is live. Not for use while PyTorch may still allocate. */
VTA_API vta_status_t vta_torch_release(void);

/* VTA_TORCH_EXC_*: which exception an out-of-memory would throw now. */
VTA_API int32_t vta_torch_exception_kind(void);

/* How the out-of-memory exception is bound to c10::OutOfMemoryError (docs/torch.md):
 *  - CONSTRUCTOR: torch exports OutOfMemoryError(SourceLocation, std::string) (torch 2.13+);
 *  - BASE_VTABLE: c10::Error's exported constructor builds the object, then OutOfMemoryError's
 *    vtable is installed: what its inherited constructor does (torch 2.3-2.12, which export
 *    no OutOfMemoryError constructor); used only once its vtable and typeinfo show it adds
 *    nothing to c10::Error.
 * The std::string ABI is the one torch's constructor takes (CXX11: torch 2.7+; OLD: 2.3-2.6). */
enum { VTA_TORCH_OOM_ROUTE_NONE = 0, VTA_TORCH_OOM_ROUTE_CONSTRUCTOR = 1, VTA_TORCH_OOM_ROUTE_BASE_VTABLE = 2 };
enum { VTA_TORCH_OOM_ABI_NONE = 0, VTA_TORCH_OOM_ABI_CXX11 = 1, VTA_TORCH_OOM_ABI_OLD = 2 };
/* The binding in force, binding first when there is none yet (until one is made, every call
 * and every out-of-memory tries again: torch may be imported after vtalloc). `libraries`
 * receives where the symbols in use came from (comma-separated); with route NONE, `reason`
 * receives why nothing bound. Either buffer may be NULL. */
VTA_API vta_status_t vta_torch_oom_binding(int32_t* route, int32_t* abi, char* libraries, uint64_t libraries_capacity,
                                           char* reason, uint64_t reason_capacity);

/* Build and throw the out-of-memory exception with `message`, catch it here, and report its
 * dynamic type name, what(), and in *caught which handlers would catch it (VTA_TORCH_CAUGHT_*,
 * asked of the typeinfos torch exports, as the C++ runtime asks them): a check that the run-time
 * binding works in this process. `route` NONE throws as vta_torch_alloc would (the binding, or
 * the fallback); another route throws through that route alone, VTA_ERR_BACKEND_UNAVAILABLE
 * (with the reason) when it does not bind here. */
enum { VTA_TORCH_CAUGHT_AS_C10_OOM = 1, VTA_TORCH_CAUGHT_AS_C10_ERROR = 2 };
VTA_API vta_status_t vta_torch_exception_selftest(const char* message, int32_t route, char* type_name,
                                                  uint64_t type_capacity, char* what, uint64_t what_capacity,
                                                  int32_t* caught);

#ifdef __cplusplus
}
#endif
#endif /* VTALLOC_TORCH_SHIM_H */
