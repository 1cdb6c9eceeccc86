// The driver seam: the operations the core needs from a memory driver (six that describe a
// backend, 22 driver operations, three with defaults), and what a backend can do, as data.
//
// Owns: the abstract `Backend`, its contract and `BackendCapabilities`. Two implementations:
// host_backend.cpp (Linux memfd + mmap, real bytes, a configured capacity) and cuda_backend.cpp
// (CUDA driver API resolved at run time); backend_registry.hpp names them. Code above this
// seam has no platform knowledge: it asks a backend's capabilities, never its kind.
//
// Contract, kept identical on both implementations so that a bug shows on either:
//  - sizes passed to reserve/create_page/map/unmap are multiples of granularity();
//  - map() places one whole page at a currently unmapped range inside one reservation; a new
//    mapping has no access until set_access() is called on it. A range past the reservation's
//    end is refused by the host backend only (the driver accepts it, observed): callers never
//    ask for it (PageTable, which makes every mapping, checks: map_pages, map_side);
//  - unmap() may not cut a mapping: every mapping it touches lies wholly inside the range
//    (one or several adjacent ones, with or without unmapped holes between or beside them;
//    holes change nothing: what the driver does); a range that cuts a mapping is refused;
//  - free_va() takes exactly a (base, size) that reserve() returned, with nothing mapped;
//  - release_page() of a mapped page is legal: its memory lives until the last unmap;
//  - copy() is ordered on `stream`; event_* order work between streams; on the host
//    backend all work is synchronous and events are complete when recorded;
//  - device_synchronize() returns once every stream's queued work has completed;
//  - a stream of the host backend never captures a graph (stream_is_capturing).
// Every operation returns a Status; none throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/status.hpp"

namespace vta {

using PageHandle = uint64_t;
using StreamHandle = uint64_t;  // 0 = the default stream
using EventHandle = uint64_t;

enum class PageLocation { device, host };

struct BackendOptions {
  int kind = VTA_BACKEND_AUTO;
  int device = 0;
  uint64_t host_device_bytes = 0;      // host backend: simulated device memory; 0 = 1 GiB
  uint64_t host_granularity_bytes = 0; // host backend: simulated granularity; 0 = 2 MiB
  int cost_model = VTA_COST_MODEL_NONE;  // host backend only: wrap it in a CostModelBackend
};

// What a backend can do. A kind's entry in the registry states what any backend of it may
// do; a backend object states what it does (cuda: host pages and export depend on the device).
// Code above the seam branches on these, never on a backend's kind.
struct BackendCapabilities {
  // Its pages are GPU memory that kernels can use: "auto" prefers such a backend, and torch's
  // "auto" takes no other (torch hands the pointers to GPU kernels).
  bool device_memory = false;
  // Its calls make its own context current on the calling thread: a caller whose own caller
  // must not see the thread's context change saves and restores it (ContextGuard).
  bool needs_context = false;
  // Its streams may capture a graph: an event recorded or a mapping changed during a capture
  // would join the graph, so frees are parked and capture is asked (stream_is_capturing).
  bool can_capture = false;
  // create_page(PageLocation::host) works: mapped eviction (CUDA >= 12.2 HOST_NUMA VMM pages).
  bool host_pages = false;
  // export_page / import_page work (the daemon's leases: POSIX file descriptors).
  bool export_pages = false;
  // launch_test_kernel and test_kernel_counters work (host_kernels.hpp).
  bool test_kernels = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int kind() const = 0;        // its registry code (VTA_BACKEND_HOST, VTA_BACKEND_CUDA, ...)
  virtual const char* name() const = 0;
  virtual int device() const = 0;
  virtual size_t granularity() const = 0;
  // Bytes a new address space may use by default (cuda: free memory less a margin).
  virtual uint64_t default_capacity() const = 0;
  // What this backend object can do (BackendCapabilities).
  virtual BackendCapabilities capabilities() const = 0;

  // Reserve `bytes` of virtual space aligned to `align` (a multiple of the granularity).
  virtual Status reserve(size_t bytes, size_t align, uintptr_t* va) = 0;
  virtual Status free_va(uintptr_t va, size_t bytes) = 0;
  virtual Status create_page(size_t bytes, PageLocation where, PageHandle* out) = 0;
  virtual Status release_page(PageHandle page) = 0;
  virtual Status map(uintptr_t va, size_t bytes, PageHandle page) = 0;
  virtual Status unmap(uintptr_t va, size_t bytes) = 0;
  virtual Status set_access(uintptr_t va, size_t bytes) = 0;

  // Copy between any two addresses the process can reach (device VA or host memory).
  virtual Status copy(uintptr_t dst, uintptr_t src, size_t bytes, StreamHandle stream) = 0;
  virtual Status stream_create(StreamHandle* out) = 0;
  virtual Status stream_destroy(StreamHandle stream) = 0;
  virtual Status stream_synchronize(StreamHandle stream) = 0;
  // Wait for all work queued on the device by this process, on every stream (cuda:
  // cuCtxSynchronize on the space's context; host: every stream of this backend). What moving
  // live bytes needs: a live block may be used on a stream the allocator was never told of
  // (only a free needs record_stream), so the streams it knows do not bound who may read it.
  // Refused while a stream of the context captures a graph (the driver's rule).
  virtual Status device_synchronize() = 0;
  virtual Status event_create(EventHandle* out) = 0;
  virtual Status event_destroy(EventHandle event) = 0;
  virtual Status event_record(EventHandle event, StreamHandle stream) = 0;
  virtual Status event_query(EventHandle event, bool* complete) = 0;
  virtual Status event_synchronize(EventHandle event) = 0;
  virtual Status stream_wait_event(StreamHandle stream, EventHandle event) = 0;
  // Whether work may be ordered on `stream`: InvalidArgument for a stream the backend does
  // not know (host: not 0 and not created by stream_create, or destroyed). Not a driver call:
  // the default accepts every handle, as cuda does, whose driver cannot tell a stream handle
  // from garbage without using it.
  virtual Status check_stream(StreamHandle stream) {
    (void)stream;
    return Status::ok();
  }

  // Host memory the device can copy to and from at full speed (cuda: page-locked).
  virtual Status host_alloc_pinned(size_t bytes, void** out) = 0;
  virtual Status host_free_pinned(void* ptr, size_t bytes) = 0;

  // Share a page with another process as a file descriptor (caller owns the fd).
  virtual Status export_page(PageHandle page, int* fd) = 0;
  // Adopt a page received as a file descriptor (the fd stays owned by the caller).
  virtual Status import_page(int fd, size_t bytes, PageHandle* out) = 0;

  // Test support (host_kernels.hpp): queue a test kernel (VTA_KERNEL_*) over [va, va + bytes)
  // on `stream`, and read the backend's kernel and copy-fault counters.
  virtual Status launch_test_kernel(StreamHandle stream, uintptr_t va, size_t bytes, int kind, uint64_t seed,
                                    uint64_t duration_ns) {
    (void)stream, (void)va, (void)bytes, (void)kind, (void)seed, (void)duration_ns;
    return test_kernels_unavailable();
  }
  virtual Status test_kernel_counters(vta_kernel_counters_t* out) {
    (void)out;
    return test_kernels_unavailable();
  }

  // Whether `stream` of a backend of `kind` (a registry code) is capturing a graph right now.
  // Asked of streams the caller owns (torch's), so no Backend object is needed: the kind's
  // registry entry answers (cuda asks the driver, cuStreamIsCapturing, on the calling thread's
  // context; a kind that cannot capture answers false). *capturing is false whenever the
  // driver cannot be asked; an unknown kind is VTA_ERR_INVALID_ARGUMENT.
  static Status stream_is_capturing(int kind, StreamHandle stream, bool* capturing);

 private:
  static Status test_kernels_unavailable() {
    return Status(VTA_ERR_BACKEND_UNAVAILABLE, "test kernels run on the host backend only");
  }
};

// Create the backend `options.kind` names (backend_registry.cpp): a registered kind's factory;
// AUTO takes the first usable backend of device memory, else the first usable other one.
Status make_backend(const BackendOptions& options, std::unique_ptr<Backend>* out);
// The host backend's factory, also what the cost model wraps.
Status make_host_backend(const BackendOptions& options, std::unique_ptr<Backend>* out);
// The host backend under the modeled clock of options.cost_model (backend/testing/cost_model.cpp):
// an unknown model, or a kind other than host, is VTA_ERR_INVALID_ARGUMENT.
Status make_cost_model_backend(const BackendOptions& options, std::unique_ptr<Backend>* out);
// The modeled host clock of `backend` if it is one make_cost_model_backend made (false, and
// *out = 0, otherwise; backend/testing/cost_model.cpp). With make_cost_model_backend, the
// one way production code reaches the cost model: by these two declarations, never an include.
bool modeled_host_ns(const Backend& backend, uint64_t* out);
}  // namespace vta
