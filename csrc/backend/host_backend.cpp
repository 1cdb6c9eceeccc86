// The host backend: the driver seam on Linux virtual memory, with real bytes.
//
// Owns: reservations (mmap PROT_NONE), pages (one memfd each), mappings
// (mmap MAP_FIXED|MAP_SHARED of a page's memfd), and a byte limit standing in for device
// memory. It enforces the CUDA rules listed in backend.hpp (no unmap that cuts a mapping,
// access only after set_access, granularity-sized operations, exact free_va) so that a policy
// bug fails here as it would on a GPU. Each rule is a claim about CUDA, observed on a driver or
// read in its documentation: testing/conformance.cpp tags every check with its evidence. Where no
// observation exists the host is at least as strict as the documentation, so a bug cannot
// pass here and fail on a GPU. One rule is deliberately stricter than the driver: a map that
// runs past its reservation's end is refused (the driver accepts it; here it would overwrite
// process memory). Copies are memcpy. Stream 0 is synchronous; a created
// stream is a worker thread (host_streams.hpp), so copies and events on it are really
// asynchronous and ordering bugs show. Host-located pages (PageLocation::host) are memfds
// too, counted apart from the simulated device memory. Copies and test kernels run under the
// fault guard of fault_guard.hpp: an access to an unmapped address is counted, not fatal
// (unlike CUDA, where it poisons the context). Each page costs one descriptor (its memfd),
// exports and imports one more each: the first host backend of a process raises the soft
// RLIMIT_NOFILE to the hard limit, and running out of descriptors is VTA_ERR_OUT_OF_MEMORY with
// the reason (docs/design.md, "Host backend fidelity").
// Invariant: every fd, mapping and reservation it creates is in its tables and counted in
// global_counters() until released.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

#include "backend/backend.hpp"
#include "backend/backend_registry.hpp"
#include "backend/counters.hpp"
#include "backend/fault_guard.hpp"
#include "backend/host_streams.hpp"

namespace vta {
namespace {

constexpr uint64_t kDefaultHostCapacity = 1ull << 30;
constexpr uint64_t kDefaultHostGranularity = 2ull << 20;

Status os_error(const char* what) {
  return Status(VTA_ERR_DRIVER, std::string("host backend: ") + what + ": " + std::strerror(errno));
}

// A call that needed a new descriptor (memfd_create, dup) failed. Out of descriptors (EMFILE:
// this process's RLIMIT_NOFILE; ENFILE: the system's table) is running out of a resource each
// page costs, so it is an out-of-memory with the reason, which callers handle as one (release
// what they created, evict, refuse the lease); anything else stays a driver error.
Status descriptor_error(const char* what) {
  int e = errno;
  if (e != EMFILE && e != ENFILE) return os_error(what);
  struct rlimit rl {};
  std::string limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                          ? std::to_string(static_cast<unsigned long long>(rl.rlim_cur))
                          : std::string("?");
  return Status(VTA_ERR_OUT_OF_MEMORY,
                std::string("host backend: out of file descriptors (") + what + ": " + std::strerror(e) +
                    "; RLIMIT_NOFILE " + limit + "): the host backend holds one descriptor per page; raise the "
                    "hard limit (ulimit -Hn) or use fewer, larger pages");
}

// The soft RLIMIT_NOFILE (often 1024) raised to the hard limit, once per process, when the
// first host backend starts: each host page is a descriptor, so the soft limit would cap a space
// near 2 GiB of 2 MiB pages. Best effort: a refusal leaves the limit as it was.
void raise_descriptor_limit_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct rlimit rl {};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  });
}

// What the host backend does: host pages, export and test kernels; its memory is host memory,
// it has no context and its streams never capture.
BackendCapabilities host_capabilities() {
  BackendCapabilities c;
  c.host_pages = true;
  c.export_pages = true;
  c.test_kernels = true;
  return c;
}

class HostBackend final : public Backend {
 public:
  HostBackend(uint64_t capacity, size_t granularity) : capacity_(capacity), granularity_(granularity) {}

  ~HostBackend() override {
    streams_.shutdown();  // no copy may run into memory released below
    // Defensive: the page table releases everything first; this only guards against leaks
    // if an owner was destroyed mid-way.
    for (auto& [va, m] : mappings_) {
      (void)m;
      global_counters().live_mappings--;
    }
    for (auto& [va, bytes] : reservations_) {
      munmap(reinterpret_cast<void*>(va), bytes);
      global_counters().live_reservations--;
      global_counters().reserved_va_bytes -= static_cast<int64_t>(bytes);
    }
    for (auto& [h, p] : pages_) {
      if (p.fd >= 0) close(p.fd);
      global_counters().live_pages--;
      global_counters().live_page_bytes -= static_cast<int64_t>(p.bytes);
    }
  }

  int kind() const override { return VTA_BACKEND_HOST; }
  const char* name() const override { return "host"; }
  int device() const override { return 0; }
  size_t granularity() const override { return granularity_; }
  uint64_t default_capacity() const override { return capacity_; }
  BackendCapabilities capabilities() const override { return host_capabilities(); }

  Status reserve(size_t bytes, size_t align, uintptr_t* va) override {
    if (bytes == 0 || bytes % granularity_) return bad("reserve: size is not a positive multiple of the granularity");
    if (align < granularity_ || align % granularity_) return bad("reserve: alignment is not a multiple of the granularity");
    if (align & (align - 1)) return bad("reserve: alignment is not a power of two");
    // Over-reserve so the base can be aligned, then trim both ends.
    size_t span = bytes + align;
    void* p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Status(VTA_ERR_OUT_OF_MEMORY, "host backend: cannot reserve virtual address space");
    uintptr_t raw = reinterpret_cast<uintptr_t>(p);
    uintptr_t base = (raw + align - 1) / align * align;
    if (base > raw) munmap(p, base - raw);
    uintptr_t end = base + bytes, raw_end = raw + span;
    if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
    std::lock_guard<std::mutex> lk(mu_);
    reservations_[base] = bytes;
    global_counters().live_reservations++;
    global_counters().reserved_va_bytes += static_cast<int64_t>(bytes);
    *va = base;
    return Status::ok();
  }

  Status free_va(uintptr_t va, size_t bytes) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = reservations_.find(va);
    if (it == reservations_.end() || it->second != bytes) return bad("free_va: not a reservation returned by reserve()");
    auto m = mappings_.lower_bound(va);
    if (m != mappings_.end() && m->first < va + bytes) return bad("free_va: the reservation still has mappings");
    if (munmap(reinterpret_cast<void*>(va), bytes) != 0) return os_error("munmap");
    reservations_.erase(it);
    global_counters().live_reservations--;
    global_counters().reserved_va_bytes -= static_cast<int64_t>(bytes);
    return Status::ok();
  }

  Status create_page(size_t bytes, PageLocation where, PageHandle* out) override {
    if (bytes == 0 || bytes % granularity_) return bad("create_page: size is not a positive multiple of the granularity");
    std::lock_guard<std::mutex> lk(mu_);
    bool device = where == PageLocation::device;
    if (device && used_ + bytes > capacity_)
      return Status(VTA_ERR_OUT_OF_MEMORY, "host backend: simulated device memory exhausted");
    int fd = memfd_create("vtalloc-page", MFD_CLOEXEC);
    if (fd < 0) return descriptor_error("memfd_create");
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      Status s = os_error("ftruncate");
      close(fd);
      return s;
    }
    return adopt_locked(fd, bytes, device, out);
  }

  Status release_page(PageHandle page) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pages_.find(page);
    if (it == pages_.end() || it->second.released) return bad("release_page: unknown page handle");
    close(it->second.fd);
    it->second.fd = -1;
    it->second.released = true;
    maybe_forget_locked(it);
    return Status::ok();
  }

  Status map(uintptr_t va, size_t bytes, PageHandle page) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pages_.find(page);
    if (it == pages_.end() || it->second.released) return bad("map: unknown page handle");
    if (bytes != it->second.bytes) return bad("map: size differs from the page's size");
    if (va % granularity_) return bad("map: address is not a multiple of the granularity");
    // The driver accepts a range that runs past the reservation's end (observed on the H100,
    // 2026-11-26); the host refuses it deliberately: mmap MAP_FIXED there would replace
    // whatever the process has beyond the reservation. The core never asks for it
    // (PageTable::map_pages checks; docs/design.md "Host backend fidelity").
    if (!inside_reservation_locked(va, bytes)) return bad("map: range is not inside one reservation");
    if (overlaps_mapping_locked(va, bytes)) return bad("map: range is already mapped");
    void* p = mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, it->second.fd, 0);
    if (p == MAP_FAILED) return os_error("mmap");
    mappings_[va] = Mapping{bytes, page};
    it->second.mappings++;
    global_counters().live_mappings++;
    return Status::ok();
  }

  Status unmap(uintptr_t va, size_t bytes) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (bytes == 0 || bytes % granularity_ || va % granularity_)
      return bad("unmap: range is not a granularity-aligned, non-empty range");
    if (!inside_reservation_locked(va, bytes)) return bad("unmap: range is not inside one reservation");
    // The range may not cut a mapping (refused, observed on the H100); holes are accepted
    // and change nothing, as the driver does: an all-hole range (observed 2026-11-22) and a
    // mapping followed by a hole (observed 2026-11-26); a hole followed by a mapping by
    // extension (documented, not yet run on a driver: the conformance check will tell). Safe
    // here: a hole inside a reservation is already a PROT_NONE placeholder, which the
    // placeholder below replaces.
    if (Status s = no_cut_mapping_locked(va, bytes, "unmap"); !s.is_ok()) return s;
    auto first = mappings_.lower_bound(va), last = mappings_.lower_bound(va + bytes);
    if (first == last) return Status::ok();  // nothing mapped: nothing changes
    void* p = mmap(reinterpret_cast<void*>(va), bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return os_error("mmap placeholder");
    for (auto m = first; m != last;) {
      auto pg = pages_.find(m->second.page);
      pg->second.mappings--;
      m = mappings_.erase(m);
      global_counters().live_mappings--;
      maybe_forget_locked(pg);
    }
    return Status::ok();
  }

  Status set_access(uintptr_t va, size_t bytes) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (bytes == 0) return bad("set_access: empty range");
    if (Status s = whole_mappings_locked(va, bytes, "set_access"); !s.is_ok()) return s;
    if (mprotect(reinterpret_cast<void*>(va), bytes, PROT_READ | PROT_WRITE) != 0) return os_error("mprotect");
    // Fill the page tables now, as a driver mapping is ready for use at once: one pass is far
    // cheaper than a fault per 4 KiB on first touch. Kernels before 5.14 lack it: then faults.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    (void)madvise(reinterpret_cast<void*>(va), bytes, MADV_POPULATE_WRITE);
    return Status::ok();
  }

  Status copy(uintptr_t dst, uintptr_t src, size_t bytes, StreamHandle stream) override {
    if (!bytes) return Status::ok();
    install_fault_guard();
    // An unmapped source or destination is an illegal access, as on a GPU: the guard stops the
    // copy and counts it (fault_guard.hpp); the stress tests count what that corrupts.
    auto task = [this, dst, src, bytes] {
      (void)guarded_copy(kernels_, reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
    };
    return streams_.enqueue(stream, task) ? Status::ok() : bad("copy: unknown stream");
  }

  Status launch_test_kernel(StreamHandle stream, uintptr_t va, size_t bytes, int kind, uint64_t seed,
                            uint64_t duration_ns) override {
    // The kernels are test code (backend/testing/host_kernels.cpp), reached through fault_guard.hpp.
    if (std::string why = test_kernel_refusal(kind, bytes, duration_ns); !why.empty()) return bad(why);
    install_fault_guard();
    kernels_.launched++;
    auto task = [this, va, bytes, kind, seed, duration_ns] { run_test_kernel(kernels_, va, bytes, kind, seed, duration_ns); };
    if (streams_.enqueue(stream, task)) return Status::ok();
    kernels_.launched--;
    return bad("test kernel: unknown stream");
  }

  Status test_kernel_counters(vta_kernel_counters_t* out) override {
    *out = kernels_.snapshot();
    return Status::ok();
  }

  Status stream_create(StreamHandle* out) override {
    *out = streams_.create_stream();
    global_counters().live_streams++;
    return Status::ok();
  }
  Status stream_destroy(StreamHandle stream) override {
    if (!streams_.destroy_stream(stream)) return bad("stream_destroy: unknown stream");
    global_counters().live_streams--;
    return Status::ok();
  }
  Status stream_synchronize(StreamHandle stream) override {
    return streams_.synchronize(stream) ? Status::ok() : bad("stream_synchronize: unknown stream");
  }
  Status device_synchronize() override {
    streams_.synchronize_all();
    return Status::ok();
  }
  Status event_create(EventHandle* out) override {
    *out = streams_.create_event();
    global_counters().live_events++;
    return Status::ok();
  }
  Status event_destroy(EventHandle event) override {
    if (!streams_.destroy_event(event)) return bad("event_destroy: unknown event");
    global_counters().live_events--;
    return Status::ok();
  }
  Status event_record(EventHandle event, StreamHandle stream) override {
    return streams_.record(event, stream) ? Status::ok() : bad("event_record: unknown event or stream");
  }
  Status event_query(EventHandle event, bool* complete) override {
    return streams_.query(event, complete) ? Status::ok() : bad("event_query: unknown event");
  }
  Status event_synchronize(EventHandle event) override {
    return streams_.wait_event(event) ? Status::ok() : bad("event_synchronize: unknown event");
  }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override {
    return streams_.stream_wait_event(stream, event) ? Status::ok() : bad("stream_wait_event: unknown event or stream");
  }

  Status check_stream(StreamHandle stream) override {
    if (streams_.known(stream)) return Status::ok();
    return bad("unknown stream " + std::to_string(stream) + " (streams are 0 and those this space created)");
  }

  Status host_alloc_pinned(size_t bytes, void** out) override {
    // Ordinary memory through the same code path the cuda backend pins.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return Status(VTA_ERR_OUT_OF_MEMORY, "host backend: cannot allocate host pool memory");
    global_counters().pinned_host_bytes += static_cast<int64_t>(bytes);
    *out = p;
    return Status::ok();
  }
  Status host_free_pinned(void* ptr, size_t bytes) override {
    if (munmap(ptr, bytes) != 0) return os_error("munmap host pool");
    global_counters().pinned_host_bytes -= static_cast<int64_t>(bytes);
    return Status::ok();
  }

  Status export_page(PageHandle page, int* fd) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pages_.find(page);
    if (it == pages_.end() || it->second.released) return bad("export_page: unknown page handle");
    int dup_fd = fcntl_dup(it->second.fd);
    if (dup_fd < 0) return descriptor_error("dup");
    *fd = dup_fd;
    return Status::ok();
  }

  Status import_page(int fd, size_t bytes, PageHandle* out) override {
    if (bytes == 0 || bytes % granularity_) return bad("import_page: size is not a positive multiple of the granularity");
    struct stat st;
    if (fstat(fd, &st) != 0) return bad("import_page: not an open file descriptor");
    if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes)
      return bad("import_page: the descriptor is not a page of that size");
    std::lock_guard<std::mutex> lk(mu_);
    if (used_ + bytes > capacity_)
      return Status(VTA_ERR_OUT_OF_MEMORY, "host backend: simulated device memory exhausted");
    int dup_fd = fcntl_dup(fd);
    if (dup_fd < 0) return descriptor_error("dup");
    return adopt_locked(dup_fd, bytes, true, out);
  }

 private:
  struct Page {
    int fd;
    size_t bytes;
    int mappings;
    bool released;
    bool device;  // counts against the simulated device memory
  };
  struct Mapping {
    size_t bytes;
    PageHandle page;
  };

  static Status bad(const std::string& msg) { return Status(VTA_ERR_INVALID_ARGUMENT, "host backend: " + msg); }
  static int fcntl_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

  // Takes ownership of fd: on failure (no memory for the book entry) it is closed.
  Status adopt_locked(int fd, size_t bytes, bool device, PageHandle* out) {
    PageHandle h = ++next_object_;
    try {
      pages_[h] = Page{fd, bytes, 0, false, device};
    } catch (const std::bad_alloc&) {
      close(fd);
      return Status(VTA_ERR_OUT_OF_MEMORY, "host backend: no memory to record a page");
    }
    if (device) used_ += bytes;
    global_counters().live_pages++;
    global_counters().live_page_bytes += static_cast<int64_t>(bytes);
    *out = h;
    return Status::ok();
  }

  // A released page's memory lives until its last mapping goes, as with cuMemRelease.
  void maybe_forget_locked(std::unordered_map<PageHandle, Page>::iterator it) {
    if (!it->second.released || it->second.mappings > 0) return;
    if (it->second.device) used_ -= it->second.bytes;
    global_counters().live_pages--;
    global_counters().live_page_bytes -= static_cast<int64_t>(it->second.bytes);
    pages_.erase(it);
  }

  bool inside_reservation_locked(uintptr_t va, size_t bytes) const {
    auto it = reservations_.upper_bound(va);
    if (it == reservations_.begin()) return false;
    --it;
    return va >= it->first && va + bytes <= it->first + it->second;
  }

  // OK iff [va, va + bytes) is exactly a run of whole, adjacent mappings: it starts where a
  // mapping starts, has no hole, and ends where a mapping ends (CUDA: cuMemUnmap cannot unmap
  // a sub-range of a mapping; cuMemSetAccess needs a fully mapped range of whole mappings).
  Status whole_mappings_locked(uintptr_t va, size_t bytes, const std::string& op) const {
    auto m = mappings_.upper_bound(va);
    if (m != mappings_.begin() && std::prev(m)->first < va && std::prev(m)->first + std::prev(m)->second.bytes > va)
      return bad(op + ": range starts inside a mapping");
    uintptr_t cur = va, end = va + bytes;
    while (cur < end) {
      auto at = mappings_.find(cur);
      if (at == mappings_.end()) return bad(op + ": range is not fully mapped");
      cur += at->second.bytes;
    }
    if (cur != end) return bad(op + ": range ends inside a mapping");
    return Status::ok();
  }

  // OK iff no mapping crosses either end of [va, va + bytes): every mapping that overlaps the
  // range lies wholly inside it; holes are allowed (CUDA: cuMemUnmap cannot unmap a sub-range
  // of a mapping; it accepts holes, observed).
  Status no_cut_mapping_locked(uintptr_t va, size_t bytes, const std::string& op) const {
    auto m = mappings_.lower_bound(va);
    if (m != mappings_.begin() && std::prev(m)->first + std::prev(m)->second.bytes > va)
      return bad(op + ": range starts inside a mapping");
    auto last = mappings_.lower_bound(va + bytes);
    if (last != mappings_.begin() && last != m && std::prev(last)->first + std::prev(last)->second.bytes > va + bytes)
      return bad(op + ": range ends inside a mapping");
    return Status::ok();
  }

  bool overlaps_mapping_locked(uintptr_t va, size_t bytes) const {
    auto it = mappings_.lower_bound(va);
    if (it != mappings_.end() && it->first < va + bytes) return true;
    if (it != mappings_.begin()) {
      --it;
      if (it->first + it->second.bytes > va) return true;
    }
    return false;
  }

  HostStreams streams_;  // declared first: destroyed last, after its workers drained
  KernelCounters kernels_;  // bumped by stream work; streams_.shutdown() runs before it goes
  std::mutex mu_;
  uint64_t capacity_;
  size_t granularity_;
  uint64_t used_ = 0;
  std::atomic<uint64_t> next_object_{0};
  std::map<uintptr_t, size_t> reservations_;
  std::map<uintptr_t, Mapping> mappings_;
  std::unordered_map<PageHandle, Page> pages_;
};

}  // namespace

Status make_host_backend(const BackendOptions& options, std::unique_ptr<Backend>* out) {
  uint64_t gran = options.host_granularity_bytes ? options.host_granularity_bytes : kDefaultHostGranularity;
  long os_page = sysconf(_SC_PAGESIZE);
  if (gran % static_cast<uint64_t>(os_page) != 0 || (gran & (gran - 1)) != 0)
    return Status(VTA_ERR_INVALID_ARGUMENT, "host granularity must be a power of two and a multiple of the OS page size");
  uint64_t cap = options.host_device_bytes ? options.host_device_bytes : kDefaultHostCapacity;
  raise_descriptor_limit_once();
  out->reset(new HostBackend(cap, gran));
  return Status::ok();
}

BackendInfo host_backend_info() {
  BackendInfo b;
  b.name = "host";
  b.capabilities = host_capabilities();
  b.make = make_host_backend;
  return b;
}

}  // namespace vta
