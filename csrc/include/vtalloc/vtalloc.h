/* vtalloc C ABI: the only symbols the shared library exports.
 *
 * Owns: the contract between the C++ core and everything above it (Python via ctypes,
 * PyTorch's CUDAPluggableAllocator, the service).
 * Invariants: every call returns a vta_status_t (0 = VTA_OK) and passes results through
 * out-parameters; no C++ exception crosses this boundary; on failure a human-readable
 * message is available from vta_last_error() on the calling thread. Structs that may grow
 * start with `uint32_t struct_size`. Bump VTA_ABI_VERSION on any incompatible change.
 */
#ifndef VTALLOC_VTALLOC_H
#define VTALLOC_VTALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VTA_ABI_VERSION 3  /* 2: vta_stats_t gained the driver call counters (an output struct grew);
                              3: vta_torch_configure returns the options it keeps (a second argument) */
#define VTA_API __attribute__((visibility("default")))

typedef int32_t vta_status_t;
enum {
  VTA_OK = 0,
  VTA_ERR_INVALID_ARGUMENT = 1,  /* bad size, double free, foreign/interior pointer, out of range */
  VTA_ERR_OUT_OF_MEMORY = 2,     /* capacity exhausted after reclaim (and eviction) */
  VTA_ERR_BACKEND_UNAVAILABLE = 3, /* no CUDA driver / no such device / VMM unsupported */
  VTA_ERR_DRIVER = 4,            /* the driver (or the OS, for the host backend) failed */
  VTA_ERR_CLOSED = 5,            /* the address space was closed */
  VTA_ERR_HOST_POOL_EXHAUSTED = 6, /* the pinned host pool cannot hold another evicted page */
  VTA_ERR_INTERNAL = 7,          /* a bug: an invariant did not hold */
  VTA_ERR_PAUSED = 8             /* the allocation belongs to a paused region: resume it first */
};

/* Backend codes (vta_config_t.backend). AUTO: a backend of device memory when one is usable, else
 * another. The built-ins' codes below never change; every backend the library knows, these and
 * any registered later (next codes), with its name and capabilities, is listed by vta_backends(). */
enum { VTA_BACKEND_AUTO = 0, VTA_BACKEND_HOST = 1, VTA_BACKEND_CUDA = 2 };

/* What a backend can do (vta_backend_info_t.capabilities). A kind's flags say what it may do:
 * HOST_PAGES and EXPORT_PAGES also depend on the device (cuda). */
enum {
  VTA_BACKEND_CAP_DEVICE_MEMORY = 1,     /* its pages are GPU memory kernels can use ("auto" prefers it) */
  VTA_BACKEND_CAP_NEEDS_CONTEXT = 2,     /* its calls switch the thread's context (the torch shim restores it) */
  VTA_BACKEND_CAP_CAN_CAPTURE = 4,       /* its streams may capture a graph (frees parked, capture asked) */
  VTA_BACKEND_CAP_HOST_PAGES = 8,        /* host-located pages: VTA_EVICT_MAPPED */
  VTA_BACKEND_CAP_EXPORT_PAGES = 16,     /* pages shared as file descriptors (the service's leases) */
  VTA_BACKEND_CAP_TEST_KERNELS = 32      /* vta_test_launch_kernel */
};

#define VTA_BACKEND_NAME_MAX 32

typedef struct vta_backend_info {
  uint32_t struct_size;            /* sizeof(vta_backend_info_t) */
  int32_t backend;                 /* its code: what vta_config_t.backend takes */
  uint32_t capabilities;           /* VTA_BACKEND_CAP_* */
  uint32_t reserved;
  char name[VTA_BACKEND_NAME_MAX]; /* what users type ("host", "cuda"), NUL-terminated */
} vta_backend_info_t;

/* Config flags. LEASED: the space creates no page itself; it holds only pages imported with
 * vta_space_import_page() (a lease from the service), and capacity_bytes is the ceiling. */
#define VTA_CONFIG_LEASED 1u

typedef struct vta_space vta_space_t;

typedef struct vta_config {
  uint32_t struct_size;          /* sizeof(vta_config_t) */
  int32_t backend;               /* VTA_BACKEND_* */
  int32_t device;                /* CUDA device ordinal (ignored by host) */
  uint32_t flags;                /* VTA_CONFIG_* */
  uint64_t capacity_bytes;       /* most device bytes of physical pages held; 0 = backend default */
  uint64_t page_bytes;           /* physical page size; 0 = backend granularity */
  uint64_t small_threshold_bytes;/* statistics: allocations at or below this are the small pool; 0 = min(1 MiB, page) */
  uint64_t host_granularity_bytes; /* host backend only: simulated granularity; 0 = 2 MiB */
  uint64_t host_capacity_bytes;  /* pinned host pool for evicted pages; 0 = default */
  uint64_t reservation_bytes;    /* VA reserved per reservation; 0 = max(2 x capacity, 64 pages) */
  uint32_t evict_mode;           /* VTA_EVICT_* */
  uint32_t reserved1;
  /* Appended: a caller whose struct_size ends before here gets VTA_COST_MODEL_NONE. */
  uint32_t cost_model;           /* VTA_COST_MODEL_*; host backend only (docs/cost-model.md) */
  uint32_t reserved2;
  /* Appended: a caller whose struct_size ends before here gets the default. */
  uint64_t extent_bytes;         /* largest physical handle under one large allocation (an extent,
                                    docs/eviction.md); 0 = 256 MiB; the page size = no extents */
} vta_config_t;

/* A driver cost model for the host backend: the bytes still move, and a modeled clock charges
 * each backend call what it cost on the named GPU (docs/cost-model.md). NONE: no model. */
enum { VTA_COST_MODEL_NONE = 0, VTA_COST_MODEL_H100 = 1, VTA_COST_MODEL_H200 = 2 };

/* Where an evicted page's bytes go. AUTO: MAPPED where the backend supports host-located
 * pages (CUDA >= 12.2 HOST_NUMA; always on host), else COPY. */
enum { VTA_EVICT_AUTO = 0, VTA_EVICT_COPY = 1, VTA_EVICT_MAPPED = 2 };
/* COPY: bytes copied to a pinned host slot; the page's address is unmapped until restored.
 * MAPPED: bytes copied to a host-located page that is then mapped at the same address, so
 * a stray access reads host memory instead of faulting. */

typedef struct vta_stats {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t capacity_bytes;
  uint64_t page_bytes;
  uint64_t small_threshold_bytes;
  uint64_t allocated_bytes;       /* live, as requested */
  uint64_t active_bytes;          /* live, rounded */
  uint64_t mapped_bytes;          /* physical pages mapped into the VA */
  uint64_t cached_bytes;          /* mapped bytes under no live allocation */
  uint64_t peak_allocated_bytes;
  uint64_t peak_active_bytes;
  uint64_t peak_mapped_bytes;
  uint64_t reserved_va_bytes;
  uint64_t num_reservations;
  uint64_t pages_total;           /* physical pages held (created or imported) */
  uint64_t pages_mapped;
  uint64_t pages_free;            /* held, unmapped */
  uint64_t num_live_allocs;
  uint64_t num_allocs;
  uint64_t num_frees;
  uint64_t num_ooms;
  uint64_t num_page_reclaims;     /* cached handles unmapped to serve a new allocation */
  uint64_t num_map_calls;         /* every driver map call of this space (cuMemMap) */
  uint64_t num_unmap_calls;       /* every driver unmap call (cuMemUnmap) */
  uint64_t pending_free_bytes;    /* freed, reusable on their own stream only until it passes them */
  /* eviction engine */
  uint64_t evict_mode;            /* VTA_EVICT_COPY or VTA_EVICT_MAPPED (the active mode) */
  uint64_t pages_resident;        /* device pages mapped under live allocations */
  uint64_t pages_evicted;         /* virtual pages whose bytes are in the host pool */
  uint64_t pages_in_flight;       /* being evicted or restored */
  uint64_t evicted_bytes;
  uint64_t evictable_bytes;       /* live allocations marked evictable (rounded) */
  uint64_t evictions;             /* pages evicted (completed) */
  uint64_t pressure_evictions;    /* of those, evicted by malloc under memory pressure */
  uint64_t restores;              /* pages restored (completed) */
  uint64_t bytes_evicted_total;
  uint64_t bytes_restored_total;
  uint64_t host_pool_capacity_bytes;
  uint64_t host_pool_bytes;       /* pinned (or host pages created) so far */
  uint64_t host_pool_used_bytes;
  uint64_t restore_wait_ns;       /* time callers spent blocked waiting for restores */
  uint64_t evict_copy_ns;         /* issue-to-completion time of eviction copies */
  uint64_t restore_copy_ns;       /* issue-to-completion time of restore copies */
  /* driver calls this space made, by kind: every call, the eviction engine's and the host
   * pool's included (num_map_calls and num_unmap_calls above count every map and unmap too) */
  uint64_t num_create_page_calls;
  uint64_t num_release_page_calls;
  uint64_t num_set_access_calls;
  uint64_t num_copy_calls;
  uint64_t num_event_record_calls;
  uint64_t num_event_query_calls;
  uint64_t num_event_synchronize_calls;
  uint64_t num_stream_wait_event_calls;
  uint64_t num_stream_synchronize_calls;
  uint64_t num_reserve_calls;
  uint64_t num_free_va_calls;
  uint64_t peak_pages_total;      /* most pages held at once since creation or the last peak reset */
  /* cumulative, since creation (appended: check struct_size) */
  uint64_t allocated_bytes_total;       /* every allocation's bytes, rounded */
  uint64_t freed_bytes_total;           /* every free's bytes, rounded */
  uint64_t requested_bytes_total;       /* every allocation's bytes, as requested */
  uint64_t requested_freed_bytes_total; /* every free's bytes, as requested */
  uint64_t page_bytes_created_total;    /* physical page bytes that came to be held (created or imported) */
  uint64_t page_bytes_released_total;   /* physical page bytes released (or given back) */
  uint64_t num_alloc_retries;           /* allocations that reclaimed cached pages or waited for frees */
  uint64_t num_sync_all_streams;        /* waits for the pending frees of every stream */
  /* extent splits (appended): at the edge of an OOM, the blocks on an extent they use only in part
   * get handles of their own at the same addresses, and the extent's untouched pages are released */
  uint64_t num_extent_splits;           /* extents split */
  uint64_t num_extent_splits_staged;    /* of those, staged through host memory (no room beside the extent) */
  uint64_t extent_split_pages;          /* pages whose bytes the splits copied */
  /* appended: device-wide waits (cuCtxSynchronize), the driver call kind after the ones above */
  uint64_t num_device_synchronize_calls;
} vta_stats_t;

/* One physical page of an address space. */
typedef struct vta_page_info {
  uint64_t page_id;
  uint64_t address;               /* where it is mapped; 0 when unmapped */
  uint32_t state;                 /* VTA_PAGE_* */
  uint32_t num_allocs;            /* live allocations overlapping it */
  uint64_t tag;                   /* leased page: the service's id for it (vta_space_import_page); else 0 */
} vta_page_info_t;
enum { VTA_PAGE_FREE = 0, VTA_PAGE_CACHED = 1, VTA_PAGE_ALLOCATED = 2, VTA_PAGE_EVICTED = 3, VTA_PAGE_IN_FLIGHT = 4 };
/* vta_pages() also lists virtual pages whose bytes are evicted or in flight; those without a
 * device page have page_id == VTA_NO_PAGE. */
#define VTA_NO_PAGE UINT64_MAX

typedef struct vta_alloc_info {
  uint64_t address;
  uint64_t size_bytes;            /* rounded */
  uint64_t requested_bytes;
  uint64_t stream;
} vta_alloc_info_t;

/* Process-wide counters of what every backend holds; all return to 0 once every space closed. */
typedef struct vta_global_counters {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t live_spaces;
  uint64_t live_pages;
  uint64_t live_page_bytes;
  uint64_t live_reservations;
  uint64_t reserved_va_bytes;
  uint64_t live_mappings;
  uint64_t pinned_host_bytes;
  uint64_t live_events;
  uint64_t live_streams;
} vta_global_counters_t;

VTA_API int32_t vta_abi_version(void);
VTA_API const char* vta_last_error(void);
/* Details of the last VTA_ERR_OUT_OF_MEMORY on this thread. */
VTA_API void vta_last_oom(uint64_t* requested_bytes, uint64_t* capacity_bytes, uint64_t* mapped_bytes);
VTA_API vta_status_t vta_global_counters(vta_global_counters_t* out);

/* Probe whether a backend can be created on `device`; VTA_OK or VTA_ERR_BACKEND_UNAVAILABLE. */
VTA_API vta_status_t vta_backend_probe(int32_t backend, int32_t device);
/* The backend registry: writes the first `capacity` backends (code order) to `out` and how many
 * there are to *count (capacity 0: only the count). */
VTA_API vta_status_t vta_backends(vta_backend_info_t* out, uint64_t capacity, uint64_t* count);
/* Tests only: registers `name` as a new backend kind, a toy that wraps the host backend
 * (csrc/backend/testing/toy_backend.cpp: no host pages), and writes its code to *backend. A name
 * registered already is VTA_ERR_INVALID_ARGUMENT. */
VTA_API vta_status_t vta_test_register_toy_backend(const char* name, int32_t* backend);
/* Run the driver-seam contract checks (backend.hpp) on a fresh backend; writes a report and
 * the number of failed checks. For tests: the same checks on host and on cuda. */
VTA_API vta_status_t vta_backend_conformance(int32_t backend, int32_t device, char* report, uint64_t report_len,
                                             int32_t* out_failures);

VTA_API vta_status_t vta_space_create(const vta_config_t* config, vta_space_t** out);
/* Release every page, mapping and reservation. Idempotent; later calls get VTA_ERR_CLOSED. */
VTA_API vta_status_t vta_space_close(vta_space_t* space);
/* Free the handle itself (after close). Not thread-safe with other calls on the handle. */
VTA_API void vta_space_destroy(vta_space_t* space);
VTA_API vta_status_t vta_space_backend(vta_space_t* space, int32_t* backend, int32_t* device);
/* The cost model's modeled host clock in ns since the space was created (docs/cost-model.md):
 * *enabled = 0 and *modeled_ns = 0 when the space runs without a cost model. */
VTA_API vta_status_t vta_space_modeled_ns(vta_space_t* space, int32_t* enabled, uint64_t* modeled_ns);

VTA_API vta_status_t vta_malloc(vta_space_t* space, uint64_t nbytes, uint64_t stream, uint64_t* out_address);
/* vta_malloc with flags: VTA_MALLOC_NO_EVICT fails with VTA_ERR_OUT_OF_MEMORY rather than
 * evict evictable pages (a leased space first asks the service for more pages). */
#define VTA_MALLOC_NO_EVICT 1u
/* A try: running short of pages fails with VTA_ERR_OUT_OF_MEMORY without counting an OOM
 * (num_ooms): the shortage a leased space reports to its page source, which answers it; the
 * caller's last try, the one it gives up on, is made without this flag and counted. */
#define VTA_MALLOC_TRY 2u
VTA_API vta_status_t vta_malloc_ex(vta_space_t* space, uint64_t nbytes, uint64_t stream, uint32_t flags,
                                   uint64_t* out_address);
VTA_API vta_status_t vta_free(vta_space_t* space, uint64_t address);
VTA_API vta_status_t vta_size_of(vta_space_t* space, uint64_t address, uint64_t* out_requested_bytes);
VTA_API vta_status_t vta_write(vta_space_t* space, uint64_t address, uint64_t offset, const void* src, uint64_t nbytes);
VTA_API vta_status_t vta_read(vta_space_t* space, uint64_t address, uint64_t offset, void* dst, uint64_t nbytes);
/* Release cached pages: unmap free ranges and give unmapped pages back to the backend. */
VTA_API vta_status_t vta_trim(vta_space_t* space, uint64_t* out_released_bytes);
VTA_API vta_status_t vta_synchronize(vta_space_t* space);
/* Unmap the device pages that offloaded allocations still hold (their bytes are on the host):
 * one wait for the streams that may touch them, none for copies still in flight (those pages
 * stay held) unless VTA_RELEASE_WAIT. Reports the mapped bytes released. */
#define VTA_RELEASE_WAIT 1u
VTA_API vta_status_t vta_release_offloaded(vta_space_t* space, uint32_t flags, uint64_t* out_released_bytes);

VTA_API vta_status_t vta_stats(vta_space_t* space, vta_stats_t* out);
VTA_API vta_status_t vta_reset_peak_stats(vta_space_t* space);
VTA_API vta_status_t vta_pages(vta_space_t* space, vta_page_info_t* out, uint64_t capacity, uint64_t* out_count);
VTA_API vta_status_t vta_allocations(vta_space_t* space, vta_alloc_info_t* out, uint64_t capacity, uint64_t* out_count);

/* --- Eviction engine -------------------------------------------------------------------- */
enum { VTA_RESIDENT = 0, VTA_EVICTED = 1, VTA_IN_FLIGHT = 2, VTA_PAUSED = 3 /* some page is a paused region's */ };
/* Mark an allocation evictable (memory pressure may evict its pages) or not (it is made
 * resident first). A page shared by several allocations is evictable only if all are. */
VTA_API vta_status_t vta_set_evictable(vta_space_t* space, uint64_t address, int32_t evictable);
/* Start evicting the allocation's pages now (asynchronous on the copy stream): every page it
 * does not share with an allocation that is not marked evictable (those stay resident).
 * VTA_ERR_INVALID_ARGUMENT when sharing keeps all of them. */
VTA_API vta_status_t vta_offload(vta_space_t* space, uint64_t address);
/* The same; *moved: the bytes of the allocation now on pages that are away (being evicted, or evicted). */
VTA_API vta_status_t vta_offload_bytes(vta_space_t* space, uint64_t address, uint64_t* moved);
/* Restore: bring the allocation's evicted pages back into device pages at the same addresses:
 * the one restore entry. Without VTA_RESTORE_WAIT it starts the restores (asynchronous, on the
 * copy stream; a prefetch) and orders `stream` after them (use_stream = 0: the allocation's own
 * stream); with it, it blocks until every page of the allocation is resident and mapped at its
 * address (ensure resident). VTA_RESTORE_TRY: no device page to restore into fails with
 * VTA_ERR_OUT_OF_MEMORY without counting an OOM, as VTA_MALLOC_TRY. Other flag bits:
 * VTA_ERR_INVALID_ARGUMENT. */
#define VTA_RESTORE_WAIT 1u
#define VTA_RESTORE_TRY 2u
VTA_API vta_status_t vta_restore(vta_space_t* space, uint64_t address, uint64_t stream, int32_t use_stream,
                                 uint32_t flags);
/* Alias of vta_restore(space, address, stream, use_stream, 0) (a prefetch), kept for callers
 * built against it. */
VTA_API vta_status_t vta_prefetch(vta_space_t* space, uint64_t address, uint64_t stream, int32_t use_stream);
/* Alias of vta_restore(space, address, stream, use_stream, VTA_RESTORE_WAIT) (ensure resident),
 * kept for callers built against it. */
VTA_API vta_status_t vta_ensure_resident(vta_space_t* space, uint64_t address, uint64_t stream, int32_t use_stream);
VTA_API vta_status_t vta_residency(vta_space_t* space, uint64_t address, int32_t* out);
/* Tests only: make the next `times` calls of a backend operation fail (0 copy, 1 map,
 * 2 create_page, 3 set_access). */
VTA_API vta_status_t vta_debug_inject_fault(vta_space_t* space, int32_t op, int32_t times);
/* Tests only: let `skip` calls of the operation pass, then fail the next `times` (skip = N - 1
 * fails the Nth call). */
VTA_API vta_status_t vta_debug_inject_fault_after(vta_space_t* space, int32_t op, int32_t skip, int32_t times);
/* Tests only: deliberately break an ordering rule of the eviction engine, so a stress test can
 * show it catches the race. Bits: change mappings under live data without waiting for the
 * streams that may touch it; start eviction copies without waiting for the page's last use;
 * treat frees as complete without waiting for their stream. 0 restores the rules. */
enum { VTA_DEBUG_BREAK_QUIESCE = 1, VTA_DEBUG_BREAK_COPY_ORDER = 2, VTA_DEBUG_BREAK_FREE_WAIT = 4 };
VTA_API vta_status_t vta_debug_break_ordering(vta_space_t* space, uint32_t mask);

/* Tests only: streams of the space's own, and test kernels on them (host backend only; other
 * backends answer VTA_ERR_BACKEND_UNAVAILABLE). A kernel is stream work over a range inside
 * one live allocation: FILL writes a pattern derived from (seed, byte index in the range),
 * CHECK counts the bytes that differ from it; whole passes repeat for duration_ns (at least
 * one, at most 60 s). It runs later on the stream, without the space's lock, like a GPU
 * kernel; an access to an address that is not mapped meanwhile stops it and is counted as a
 * fault (a GPU would poison the context instead). Stream 0 runs it on the calling thread. */
enum { VTA_KERNEL_FILL = 0, VTA_KERNEL_CHECK = 1 };
typedef struct vta_kernel_counters {
  uint32_t struct_size;
  uint32_t reserved0;
  uint64_t kernels_launched;
  uint64_t kernels_completed;
  uint64_t kernels_faulted;       /* stopped by an access to an unmapped address */
  uint64_t copy_faults;           /* backend copies abandoned on such an access */
  uint64_t bytes_checked;         /* by CHECK kernels, once per completed pass */
  uint64_t bytes_mismatched;      /* of those, bytes that differed from the pattern */
} vta_kernel_counters_t;
VTA_API vta_status_t vta_debug_stream_create(vta_space_t* space, uint64_t* out_stream);
/* Waits for the stream's work, then destroys it; refused while a live allocation uses it. */
VTA_API vta_status_t vta_debug_stream_destroy(vta_space_t* space, uint64_t stream);
VTA_API vta_status_t vta_debug_stream_synchronize(vta_space_t* space, uint64_t stream);
VTA_API vta_status_t vta_debug_run_kernel(vta_space_t* space, uint64_t stream, uint64_t address, uint64_t nbytes,
                                          int32_t kind, uint64_t seed, uint64_t duration_ns);
/* The space's backend's counters (every kernel and copy since the space was created). */
VTA_API vta_status_t vta_debug_kernel_counters(vta_space_t* space, vta_kernel_counters_t* out);
/* Tests only: the eviction engine's victim candidates (resident pages it may evict) now, and
 * the entries its victim policy touched since the space was created: one per page noted or
 * forgotten, one per stored range cut by a range forget (what a free costs in the LRU). */
VTA_API vta_status_t vta_debug_victim_counters(vta_space_t* space, uint64_t* out_candidate_pages,
                                               uint64_t* out_entries_touched);
/* Faults the host backend's guards caught in this process, all spaces together, never reset. */
VTA_API vta_status_t vta_debug_fault_totals(uint64_t* out_kernel_faults, uint64_t* out_copy_faults);

/* --- Leased pages (client side of the service) ------------------------------------------ */
/* Adopt a page received as a file descriptor (the caller keeps and closes `fd`). The page
 * joins the free (unmapped) pages; `tag` is the service's id for it, given back on return. */
VTA_API vta_status_t vta_space_import_page(vta_space_t* space, int32_t fd, uint64_t tag);
/* Give back up to `max_pages` pages that hold no live data (unmapping cached ones as needed).
 * Writes their tags to out_tags (room for max_pages) and the number to *out_count. */
VTA_API vta_status_t vta_space_return_pages(vta_space_t* space, uint64_t max_pages, uint64_t* out_tags,
                                            uint64_t* out_count);

/* --- Page pool (service side): physical pages created and exported, never mapped --------- */
typedef struct vta_pool vta_pool_t;
typedef struct vta_pool_info {
  uint32_t struct_size;
  int32_t backend;
  int32_t device;
  uint32_t exportable;            /* 1 when pages can be exported as POSIX file descriptors */
  uint64_t page_bytes;
  uint64_t capacity_bytes;
  uint64_t pages_held;
} vta_pool_info_t;
/* Uses config->backend, device, capacity_bytes, page_bytes, host_granularity_bytes. */
VTA_API vta_status_t vta_pool_create(const vta_config_t* config, vta_pool_t** out);
VTA_API vta_status_t vta_pool_close(vta_pool_t* pool);  /* releases every page; idempotent */
VTA_API void vta_pool_destroy(vta_pool_t* pool);
VTA_API vta_status_t vta_pool_info(vta_pool_t* pool, vta_pool_info_t* out);
VTA_API vta_status_t vta_pool_create_page(vta_pool_t* pool, uint64_t* out_page_id);
/* A new file descriptor for the page on each call; the caller owns and closes it. */
VTA_API vta_status_t vta_pool_export_page(vta_pool_t* pool, uint64_t page_id, int32_t* out_fd);
VTA_API vta_status_t vta_pool_release_page(vta_pool_t* pool, uint64_t page_id);

/* --- record_stream (appended) ------------------------------------------------------------ */
/* The live allocation at `address` is also used on `stream` (PyTorch's Tensor.record_stream):
 * at its free an event is recorded on each such stream, and its memory is reused (even on its
 * own stream) only once all of them completed. Its own stream, or one twice: nothing. */
VTA_API vta_status_t vta_record_stream(vta_space_t* space, uint64_t address, uint64_t stream);

/* --- Regions (appended): allocations made under a tag, paused and resumed together ------ */
/* A region is the allocations (graph pools' kept blocks included) that carry one tag. Pausing it
 * moves its pages off the device, a batch at a time (copy runs on the copy stream, one wait,
 * one quiesce): their bytes go to the host pool (or nowhere: VTA_PAUSE_DISCARD), their device
 * pages are released (a leased space's stay unmapped, for the service), and the addresses stay
 * reserved and unmapped. Reading, writing, restoring or offloading a paused allocation fails
 * with VTA_ERR_PAUSED until the region is resumed, which maps device pages at the same
 * addresses and copies the bytes back (docs/regions.md). */
#define VTA_REGION_TAG_BYTES 72 /* room for a tag: at most 64 characters and the NUL */
/* The id of region tag `name` (1 to 64 letters, digits and . _ - : / @ +, a letter or digit
 * first), interned for the life of the process (at most 4096 tags); 0 means no region. */
VTA_API vta_status_t vta_region_tag(const char* name, uint32_t* out_region);
/* The name of tag `region` (NUL-terminated, at most VTA_REGION_TAG_BYTES bytes written). */
VTA_API vta_status_t vta_region_tag_name(uint32_t region, char* out, uint64_t out_len);
/* vta_malloc_ex whose allocation carries region tag `region` (0: none). While any allocation
 * carries a tag, a block shares no page with a block of another region (or of none). */
VTA_API vta_status_t vta_malloc_region(vta_space_t* space, uint64_t nbytes, uint64_t stream, uint32_t flags,
                                       uint32_t region, uint64_t* out_address);
/* Pause region `region`: waits for the copies; *out_page_bytes: device page bytes it took off the
 * device. All or nothing until the copies completed (VTA_ERR_HOST_POOL_EXHAUSTED when the host
 * pool cannot hold the region: nothing moved). Pages the region shares with other regions'
 * blocks stay on the device. Not during a CUDA graph capture. */
#define VTA_PAUSE_DISCARD 1u /* keep no copy: resume maps fresh memory (contents undefined) */
VTA_API vta_status_t vta_region_pause(vta_space_t* space, uint32_t region, uint32_t flags, uint64_t* out_page_bytes);
/* Resume region `region`: device pages are taken in the allocation order (free and cached pages,
 * held pages of offloaded allocations, then evicting allocations marked evictable, least recently
 * used first), mapped at the same addresses, filled, and waited for. All or nothing: out of
 * memory (VTA_ERR_OUT_OF_MEMORY; counted unless VTA_RESTORE_TRY) leaves the region paused.
 * *out_page_bytes: the device page bytes it brought back. */
VTA_API vta_status_t vta_region_resume(vta_space_t* space, uint32_t region, uint32_t flags, uint64_t* out_page_bytes);
typedef struct vta_region_info {
  uint32_t struct_size;
  uint32_t region;                /* the tag's id */
  char tag[VTA_REGION_TAG_BYTES]; /* its name, NUL-terminated */
  uint64_t allocations;           /* live allocations carrying the tag (graph pools' kept blocks included) */
  uint64_t bytes;                 /* their bytes, rounded */
  uint64_t paused_bytes;          /* of those, bytes on paused pages (off the device) */
  uint64_t discarded_bytes;       /* of the paused bytes, those with no copy (discard) */
  uint64_t paused_page_bytes;     /* device page bytes the paused pages no longer hold */
  uint64_t host_bytes;            /* host pool bytes holding the paused pages' copies */
  uint64_t pauses;                /* pauses that took pages off the device, since the space was made */
  uint64_t resumes;               /* resumes that brought pages back */
  uint64_t bytes_paused_total;    /* device page bytes pauses took off the device */
  uint64_t bytes_resumed_total;   /* device page bytes resumes brought back */
  uint64_t pause_ns_total;        /* time spent in pauses (copies and waits included) */
  uint64_t resume_ns_total;       /* time spent in resumes */
} vta_region_info_t;
/* One row per tag this space has an allocation of, or paused or resumed, in tag id order. */
VTA_API vta_status_t vta_regions(vta_space_t* space, vta_region_info_t* out, uint64_t capacity, uint64_t* out_count);

#ifdef __cplusplus
}
#endif
#endif /* VTALLOC_VTALLOC_H */
