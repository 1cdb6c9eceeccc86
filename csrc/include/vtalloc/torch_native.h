/* vtalloc's torch-native C ABI: what the torch-native binding (csrc/torch_binding/, a C++
 * class implementing PyTorch's CUDAAllocator, compiled against the user's torch) calls.
 *
 * Owns: nothing of its own beyond torch_shim.h's per-device spaces: these functions serve the
 * same spaces (one per device, options from vta_torch_configure) with what PyTorch's full
 * allocator interface needs and its pluggable one lacks: non-throwing allocation (the binding
 * throws torch's own exceptions), frees found by address, record_stream, graph-private pools
 * with use counts and checkpoints, the largest allocatable block (cacheInfo, cudnn.benchmark),
 * statistics with PyTorch's (current, peak, allocated, freed) quadruples, and a listing of
 * blocks for snapshots.
 * Invariants:
 *  - Every function returns a status, never lets a C++ exception out, never calls Python or
 *    takes the GIL; on failure vta_torch_last_error() holds a message for this thread.
 *  - The binding and the pluggable shim (vta_torch_alloc/free) serve the same spaces; a process
 *    uses one of them as torch's allocator (enable() picks), never both at once.
 *  - A pool id is PyTorch's MempoolId_t: two integers, {0, 0} meaning "no pool". A block
 *    allocated in a pool belongs to it for life: freed while the pool has users, it is kept
 *    in the pool (cached) and reused only by allocations in that pool, on its own stream; it
 *    goes back to the device's space when the pool's last user leaves (vta_torch_pool_release)
 *    or, for a block still live then, when it is freed.
 *  - A block on which record_stream was called is not reused, not even on its own stream,
 *    until the work queued on every recorded stream up to its free has completed.
 *  - Frees on a stream that is capturing a CUDA graph are parked and done after the capture
 *    (their events would otherwise become part of the graph), except a pool's blocks while the
 *    pool has users: they go back to the pool at once, with no event, so the capture reuses
 *    them in stream order; allocations during capture need a pool, and run their driver calls
 *    in the relaxed capture mode.
 */
#ifndef VTALLOC_TORCH_NATIVE_H
#define VTALLOC_TORCH_NATIVE_H

#include <stddef.h>
#include <stdint.h>

#include "vtalloc/torch_shim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this ABI. A binding built against another value refuses to install (its
 * Python side rebuilds it), so a vtalloc upgrade can never run a stale binding. */
#define VTA_TORCH_NATIVE_ABI 1
VTA_API int32_t vta_torch_native_abi(void);

/* PyTorch's MempoolId_t. */
typedef struct vta_torch_pool_id {
  uint64_t first;
  uint64_t second;
} vta_torch_pool_id_t;

/* Allocate `size` (> 0) bytes on `device` for work on `stream` (a cudaStream_t; NULL is the
 * legacy default stream). `pool` NULL or {0, 0}: from the device's space; otherwise in that
 * pool, which must exist (vta_torch_pool_incref). Never throws:
 *  - VTA_ERR_OUT_OF_MEMORY: recorded in vta_torch_failures (with the numbers the binding puts
 *    in torch's OutOfMemoryError: vta_torch_failures' last_oom_*), message in last_error;
 *  - VTA_ERR_INVALID_ARGUMENT: size 0, bad device, unknown pool, or `stream` capturing a graph
 *    and no pool given. */
VTA_API vta_status_t vta_torch_malloc(uint64_t size, int32_t device, void* stream, const vta_torch_pool_id_t* pool,
                                      void** out);

/* Free the block at `ptr` (its start, as vta_torch_malloc returned it), whichever device it is
 * on; *device_out (may be NULL) receives that device. A failure (unknown pointer, double free)
 * is counted in the device's free_failures as vta_torch_free's are, and reported. */
VTA_API vta_status_t vta_torch_free_ptr(void* ptr, int32_t* device_out);

/* The device whose space holds the block starting at `ptr`; VTA_ERR_INVALID_ARGUMENT if none. */
VTA_API vta_status_t vta_torch_device_of(void* ptr, int32_t* device);

/* The live block containing `ptr` (any address inside it): its start and its size as requested. */
VTA_API vta_status_t vta_torch_base_allocation(void* ptr, void** base, uint64_t* size);

/* Tensor.record_stream: the block at `ptr` (its start) is also used on `stream`. At its free,
 * an event is recorded on each such stream (other than the block's own) and the block is
 * reused only once all have completed. Recording the block's own stream, or one twice, does
 * nothing. */
VTA_API vta_status_t vta_torch_record_stream(void* ptr, void* stream);

/* cacheInfo: the largest single allocation `device` could serve now without evicting and
 * without the driver creating memory the device does not have free: capacity less live
 * (rounded) bytes, no more than what the driver reports free plus the pages the space holds
 * unused or cached. 0 when the device has no space yet and nothing is configured. */
VTA_API vta_status_t vta_torch_largest_allocatable(int32_t device, uint64_t* bytes);

/* One of PyTorch's StatArray entries (its "all" aggregate). */
typedef struct vta_torch_stat {
  int64_t current;
  int64_t peak;
  int64_t allocated; /* increments since the last reset of accumulated stats */
  int64_t freed;     /* decrements since the last reset of accumulated stats */
} vta_torch_stat_t;

/* A device's statistics in PyTorch's terms (torch.cuda.memory_stats()); what each means for
 * vtalloc is in docs/torch.md, "Statistics". Peaks restart at vta_torch_reset_peak_stats,
 * allocated/freed and the num_* counters at vta_torch_reset_accumulated. All zero when the
 * device has no space. Small/large: blocks at or under the space's small_threshold, and the
 * rest (PyTorch's two pools; every block is whole 512-byte units on pages blocks share). */
typedef struct vta_torch_device_stats {
  uint32_t struct_size;
  uint32_t reserved0;
  vta_torch_stat_t allocation[3];      /* [0] all, [1] small, [2] large: live blocks */
  vta_torch_stat_t allocated_bytes[3]; /* live blocks, as rounded by the allocator */
  vta_torch_stat_t requested_bytes[3]; /* live blocks, as requested */
  vta_torch_stat_t active_bytes[3];    /* live blocks and freed ones still waiting for their streams */
  vta_torch_stat_t reserved_bytes[3];  /* physical pages held, mapped or not ([1], [2]: 0) */
  vta_torch_stat_t segment[3];         /* physical handles held (a page, or an extent of pages) */
  int64_t num_alloc_retries;           /* allocations that had to reclaim cached pages or wait for frees */
  int64_t num_ooms;
  int64_t num_sync_all_streams;        /* waits on every stream's pending frees */
  int64_t num_device_alloc;            /* driver map calls */
  int64_t num_device_free;             /* driver unmap calls */
  uint64_t pool_reserved_bytes;        /* bytes held by graph-private pools (live and cached blocks) */
} vta_torch_device_stats_t;

VTA_API vta_status_t vta_torch_device_stats(int32_t device, vta_torch_device_stats_t* out);
/* device -1: every device with a space. */
VTA_API vta_status_t vta_torch_reset_accumulated(int32_t device);

/* torch.cuda.set_per_process_memory_fraction: cap the physical memory `device`'s space may
 * hold at `bytes` (no more than its capacity; 0 lifts the cap back to the capacity). Memory
 * already held stays; a request that would need more than the cap after reclaiming cached
 * pages fails with VTA_ERR_OUT_OF_MEMORY. Before the device's space exists, the cap is kept
 * and applied when it is created. *limit_out of vta_torch_get_limit: the cap in force. */
VTA_API vta_status_t vta_torch_set_limit(int32_t device, uint64_t bytes);
VTA_API vta_status_t vta_torch_get_limit(int32_t device, uint64_t* limit_out);

/* -- graph-private pools ------------------------------------------------------------------
 * PyTorch's CUDAGraph and MemPool lifecycle: createOrIncrefPool / beginAllocateToPool add a
 * user (vta_torch_pool_incref creates the pool with one user, or adds one), releasePool drops
 * one (vta_torch_pool_release; at zero, cached blocks go back to the space at once and live
 * ones at their free). Routing allocations to a pool (PyTorch's filter on the stream) is the
 * binding's: it passes the pool to vta_torch_malloc. */
VTA_API vta_status_t vta_torch_pool_incref(int32_t device, vta_torch_pool_id_t pool);
VTA_API vta_status_t vta_torch_pool_release(int32_t device, vta_torch_pool_id_t pool);
/* Users of the pool; 0 when it does not exist (or no longer has users). */
VTA_API vta_status_t vta_torch_pool_use_count(int32_t device, vta_torch_pool_id_t pool, int32_t* out);
/* emptyCache(pool): give the pool's cached blocks back to the space, only if it has no users
 * (a live graph may still use them); *released (may be NULL): bytes given back. */
VTA_API vta_status_t vta_torch_pool_empty(int32_t device, vta_torch_pool_id_t pool, uint64_t* released);

enum { VTA_TORCH_BLOCK_LIVE = 1, VTA_TORCH_BLOCK_POOL_CACHED = 2 };

/* One block: a live allocation, or a freed block kept by its pool. */
typedef struct vta_torch_block {
  uint64_t address;
  uint64_t size;      /* as rounded by the allocator */
  uint64_t requested; /* as requested */
  uint64_t stream;    /* the stream it was allocated for */
  vta_torch_pool_id_t pool; /* {0, 0}: not in a pool */
  uint32_t state;     /* VTA_TORCH_BLOCK_* */
  uint32_t small;     /* 1: at or under small_threshold (PyTorch's small pool) */
} vta_torch_block_t;

/* The blocks of `device` (pool NULL: every block; else only that pool's, live and cached), in
 * address order. Copies min(count, capacity) into `out` (may be NULL with capacity 0) and sets
 * *count to the number there are. */
VTA_API vta_status_t vta_torch_blocks(int32_t device, const vta_torch_pool_id_t* pool, vta_torch_block_t* out,
                                      uint64_t capacity, uint64_t* count);

/* setCheckpointPoolState: make exactly the blocks at `live` (n addresses, each a live or
 * cached block of the pool) the pool's live blocks. Live blocks not listed become cached (they
 * are "freed" without a free call: the caller stops their storages' deleters); cached blocks
 * listed become live. `freed` / `allocated` receive those addresses (capacity each at least
 * the pool's block count), with their counts. Nothing changes on an error (an address that is
 * not the pool's, a pool that does not exist). */
VTA_API vta_status_t vta_torch_pool_set_live(int32_t device, vta_torch_pool_id_t pool, const uint64_t* live, uint64_t n,
                                             uint64_t* freed, uint64_t freed_capacity, uint64_t* n_freed,
                                             uint64_t* allocated, uint64_t allocated_capacity, uint64_t* n_allocated);

#ifdef __cplusplus
}
#endif

#endif /* VTALLOC_TORCH_NATIVE_H */
