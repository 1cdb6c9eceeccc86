// AddressSpace implementation: setup, teardown and the allocation entry points.
//
// Owns: the order of the steps of each entry point (which drains and releases come first), an
// allocation's "need a page": between the policy's steps, the engine frees a device page; and
// the process's space extension factory (space_extension.hpp).
// Invariants: those of address_space.hpp; close() waits for in-flight copies before the
// events go, and tells the extension (whose test streams' kernels end then) before any page is
// released.
#include "space/address_space.hpp"

#include <atomic>
#include <string>

#include "backend/counters.hpp"
#include "vmm/page_geometry.hpp"

namespace vta {
namespace {

// Constant-initialized, so a factory set from another file's static initializer is never lost.
std::atomic<SpaceExtensionFactory> g_extension_factory{nullptr};

// An allocation in progress that an error ends (a driver call refused, in the policy or in the
// engine) gives back what it holds: the handles taken, the runs mapped, its range. After done or
// failed it holds nothing, and this does nothing.
class PlacementUndo {
 public:
  PlacementUndo(AllocPolicy& policy, AllocPolicy::Placement& p) : policy_(policy), p_(p) {}
  ~PlacementUndo() {
    try {
      policy_.abandon(p_);
    } catch (...) {
      // The error that ended the placement is the one reported; an unmap refused here leaves
      // those pages mapped under free space, as cached handles.
    }
  }
  PlacementUndo(const PlacementUndo&) = delete;
  PlacementUndo& operator=(const PlacementUndo&) = delete;

 private:
  AllocPolicy& policy_;
  AllocPolicy::Placement& p_;
};

// The chain over `calls`: the extension's adaptor when there is an extension, else calls itself.
std::unique_ptr<Backend> adapted(SpaceExtension* extension, CallCountingBackend* calls) {
  std::unique_ptr<Backend> counted(calls);
  return extension ? extension->adapt(std::move(counted)) : std::move(counted);
}

}  // namespace

SpaceExtensionFactory set_space_extension_factory(SpaceExtensionFactory factory) {
  return g_extension_factory.exchange(factory);
}

SpaceExtensionFactory space_extension_factory() { return g_extension_factory.load(); }

std::unique_ptr<AddressSpace> AddressSpace::create(const vta_config_t& config) {
  if (config.flags & ~VTA_CONFIG_LEASED) fail(VTA_ERR_INVALID_ARGUMENT, "unknown vta_config_t flags");
  check_space_bytes("reservation_size", config.reservation_bytes);  // capacity: make_page_geometry
  PageGeometry g = make_page_geometry(config);
  SpaceExtensionFactory make_extension = space_extension_factory();
  return std::unique_ptr<AddressSpace>(new AddressSpace(std::move(g.backend), make_extension ? make_extension() : nullptr,
                                                        config, g.capacity_bytes, g.page_bytes));
}

AddressSpace::AddressSpace(std::unique_ptr<Backend> backend, std::unique_ptr<SpaceExtension> extension,
                           const vta_config_t& config, uint64_t capacity, size_t page_bytes)
    : extension_(std::move(extension)),
      calls_(new CallCountingBackend(std::move(backend))),
      backend_(adapted(extension_.get(), calls_)),
      backend_kind_(backend_->kind()),
      backend_info_(find_backend(backend_kind_)),
      capabilities_(backend_->capabilities()),
      device_(backend_->device()),
      capacity_(capacity),
      page_bytes_(page_bytes),
      pages_(*backend_, page_bytes, capacity),
      events_(*backend_),
      policy_(config, *backend_, pages_, events_, capacity),  // validates small_threshold first
      residency_(config, *backend_, pages_, events_, policy_.facts(), capacity),
      regions_(page_bytes) {
  if (!backend_info_) fail(VTA_ERR_INTERNAL, "the backend's kind " + std::to_string(backend_kind_) + " is not registered");
  policy_.set_port(&residency_);
  if (config.flags & VTA_CONFIG_LEASED) {
    leased_ = true;
    policy_.disable_extents();  // leased pages are the service's one-page pages
    pages_.set_capacity_pages(0);  // grows with each imported page, up to capacity_
  }
  global_counters().live_spaces++;
}

AddressSpace::~AddressSpace() {
  try {
    close();
  } catch (...) {
    // A driver failure while tearing down has been reported by close() if anyone asked.
  }
}

void AddressSpace::check_open_locked() const {
  if (closed_) fail(VTA_ERR_CLOSED, "the address space is closed");
}

uintptr_t AddressSpace::malloc(uint64_t nbytes, StreamHandle stream, bool allow_evict, bool count_oom,
                              uint32_t region) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  check(backend_->check_stream(stream));  // the host backend refuses an unknown stream; cuda cannot tell
  AllocPolicy::Request r = policy_.request(nbytes);
  r.region = region;
  residency_.drain_inflight(false);  // pending frees: the policy polls them only when it needs them
  // "Need a page", as for a restore: the policy places the block in steps, and each time its own
  // sources of handles are spent the engine frees a device page (never under the block, which is
  // taken from the free space but not live yet), then the policy goes on where it stood.
  AllocPolicy::Placement p(r, stream, allow_evict, count_oom);
  PlacementUndo undo(policy_, p);
  AllocPolicy::Step step = policy_.begin_allocate(p);
  while (step == AllocPolicy::Step::needs_page)
    step = policy_.resume(p, residency_.free_device_page(p.may_evict(), p.block_lo(), p.block_hi()));
  if (step == AllocPolicy::Step::failed) policy_.throw_oom(p.requested(), nullptr, p.count_oom());
  return p.address();
}

void AddressSpace::free(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.free(address);
}

uint64_t AddressSpace::size_of(uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  return policy_.live().find_live(address)->second.requested;
}

void AddressSpace::write(uintptr_t address, uint64_t offset, const void* src, uint64_t nbytes) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  const Allocation& a = policy_.live().find_range(address, offset, nbytes);
  if (nbytes == 0) return;
  check_not_paused_locked(address + offset, nbytes, "write");
  residency_.copy_bytes(address + offset, reinterpret_cast<uintptr_t>(src), nbytes, a.stream, true);
}

void AddressSpace::read(uintptr_t address, uint64_t offset, void* dst, uint64_t nbytes) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  const Allocation& a = policy_.live().find_range(address, offset, nbytes);
  if (nbytes == 0) return;
  check_not_paused_locked(address + offset, nbytes, "read");
  residency_.copy_bytes(address + offset, reinterpret_cast<uintptr_t>(dst), nbytes, a.stream, false);
}

uint64_t AddressSpace::trim() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.drain_pending(true);
  residency_.drain_inflight(false);
  residency_.release_evicted();  // their device pages become free pages, released below
  policy_.unmap_cached();
  return pages_.release_free_pages();
}

uint64_t AddressSpace::release_offloaded(bool wait) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  residency_.drain_inflight(wait);  // copies done become evicted; with wait, every copy in flight first
  uint64_t before = pages_.pages_mapped();
  residency_.release_evicted();
  uint64_t after = pages_.pages_mapped();
  return (before > after ? before - after : 0) * page_bytes_;
}

void AddressSpace::import_page(int fd, uint64_t tag) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  if (!leased_) fail(VTA_ERR_INVALID_ARGUMENT, "import_page needs an address space created in leased mode");
  if (fd < 0) fail(VTA_ERR_INVALID_ARGUMENT, "import_page: invalid file descriptor");
  if ((pages_.pages_held() + 1) * page_bytes_ > capacity_)
    fail(VTA_ERR_INVALID_ARGUMENT, "import_page: the lease would exceed this space's capacity ceiling");
  if (pages_.holds_tag(tag))  // a tag names the page when it is given back: two would be ambiguous
    fail(VTA_ERR_INVALID_ARGUMENT, "import_page: this space already holds a page with tag " + std::to_string(tag));
  PageHandle h = 0;
  check(backend_->import_page(fd, page_bytes_, &h));
  pages_.adopt_page(h, tag);  // releases h itself if it cannot record it
}

std::vector<uint64_t> AddressSpace::return_pages(uint64_t max_pages) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  if (!leased_) fail(VTA_ERR_INVALID_ARGUMENT, "return_pages needs an address space created in leased mode");
  policy_.settle();  // frees of every stream go to their events: the pages may leave this space
  residency_.drain_inflight(false);
  if (pages_.pages_unmapped() < max_pages) residency_.release_evicted();
  while (pages_.pages_unmapped() < max_pages && policy_.reclaim_one_handle()) {
  }
  return pages_.give_back_pages(max_pages);
}

void AddressSpace::synchronize() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.drain_pending(true);
  residency_.drain_inflight(true);
  // Every deferred mapping change happens now, after one wait for the streams involved.
  residency_.release_evicted();
  residency_.swap_restored();
}

void AddressSpace::close() {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return;
  closed_ = true;
  Status first_error;
  auto keep = [&](const Error& e) {
    if (first_error.is_ok()) first_error = Status(e.code(), e.what());
  };
  try {
    policy_.drain_pending(true);
  } catch (const Error& e) {
    keep(e);
  }
  try {
    residency_.close();  // waits for in-flight copies: before the events go
  } catch (const Error& e) {
    keep(e);
  }
  if (extension_) extension_->closing(*backend_);  // before events and pages go (test streams' kernels end)
  events_.destroy_all();
  policy_.clear();
  regions_.clear();
  try {
    pages_.release_all();
  } catch (const Error& e) {
    keep(e);
  }
  backend_.reset();
  global_counters().live_spaces--;
  check(first_error);
}

}  // namespace vta
