// CostModelBackend: an adaptor over the host backend that keeps a modeled clock of what each
// call would cost on a GPU, so paging work can be measured without one (docs/cost-model.md).
//
// Owns: the per-call cost tables of the GPUs measured (DriverCosts: an H100 (80GB HBM3),
// 2026-11-22, and an H200, 2026-11-28), and the modeled timelines: one for the host (the calling thread),
// one per stream, one per copy direction (the PCIe link each way), and the modeled completion
// time of every event. The wrapped backend still does every call for real (bytes move); the
// model only accounts time.
// Invariants: modeled time never goes backwards on any timeline; a call charges the host
// timeline its cost whether or not the wrapped call succeeds; a copy starts no earlier than
// the host issued it, its stream's previous work ended and its direction's link is free, and
// lasts bytes / bandwidth(bytes); an event completes at its stream's tail when recorded;
// event_query answers complete only if both the wrapped event and the modeled time say so.
// Thread-safe (one mutex over the model; the wrapped backend is called outside it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend/forwarding_backend.hpp"

namespace vta {

// What one backend call costs, in microseconds, at the first `size_points` handle sizes (at
// most kSizePoints); copy bandwidths in GB/s at the first `copy_points` copy sizes. Between
// points: linear in log2(size); outside: the nearest point.
struct DriverCosts {
  static constexpr int kSizePoints = 4;
  double handle_mib[kSizePoints];
  double create_us[kSizePoints], map_us[kSizePoints], set_access_us[kSizePoints];
  double unmap_us[kSizePoints], release_us[kSizePoints];
  double event_record_us, event_query_us;
  static constexpr int kCopyPoints = 4;
  double copy_mib[kCopyPoints];
  double d2h_gbps[kCopyPoints], h2d_gbps[kCopyPoints];
  // Device-to-host copies whose destination is a host-located VMM page (mapped-mode eviction)
  // run at this fraction of the pinned D2H figure. FITTED, not measured per call: see
  // kH100 in cost_model.cpp and docs/cost-model.md.
  double d2h_to_host_page_factor;
  // Added to each cuMemUnmap of a mapping of a host-located VMM page (mapped-mode restore).
  // FITTED, not measured per call: see kH100 in cost_model.cpp and docs/cost-model.md.
  double host_page_unmap_extra_us;
  int size_points = kSizePoints;
  int copy_points = kCopyPoints;
  // Charged to the host after each blocking wait (event or stream synchronize, device
  // synchronize) that had work to wait for: the time from the GPU finishing to the waiting
  // thread running again. DERIVED, not measured per call: see kH200 in cost_model.cpp.
  double wake_after_wait_us = 0;
  // Host-to-device copies whose source is a host-located VMM page (mapped-mode restore) run at
  // this fraction of the pinned H2D figure. FITTED: see kH200 in cost_model.cpp.
  double h2d_from_host_page_factor = 1.0;
};

// The table of VTA_COST_MODEL_*; null for VTA_COST_MODEL_NONE or an unknown model.
const DriverCosts* driver_costs(int cost_model);

class CostModelBackend final : public ForwardingBackend {
 public:
  CostModelBackend(std::unique_ptr<Backend> inner, const DriverCosts& costs)
      : ForwardingBackend(std::move(inner)), costs_(costs) {}

  // The host timeline: modeled ns the calling threads spent in (or blocked on) the backend.
  uint64_t host_ns() const;
  // Cost of one call at a handle size, and copy bandwidth at a copy size (GB/s).
  double call_us(double (DriverCosts::*table)[DriverCosts::kSizePoints], size_t bytes) const;
  double copy_gbps(size_t bytes, bool d2h) const;

  // The calls the model charges; every other call is forwarded and costs nothing.
  Status create_page(size_t b, PageLocation w, PageHandle* out) override;
  Status release_page(PageHandle p) override;
  Status map(uintptr_t va, size_t b, PageHandle p) override;
  Status unmap(uintptr_t va, size_t b) override;
  Status set_access(uintptr_t va, size_t b) override;
  Status copy(uintptr_t d, uintptr_t s, size_t b, StreamHandle st) override;
  Status stream_destroy(StreamHandle s) override;
  Status stream_synchronize(StreamHandle s) override;
  Status device_synchronize() override;
  Status event_destroy(EventHandle e) override;
  Status event_record(EventHandle e, StreamHandle s) override;
  Status event_query(EventHandle e, bool* c) override;
  Status event_synchronize(EventHandle e) override;
  Status stream_wait_event(StreamHandle s, EventHandle e) override;
  Status import_page(int fd, size_t b, PageHandle* out) override;
  Status launch_test_kernel(StreamHandle s, uintptr_t va, size_t b, int kind, uint64_t seed, uint64_t ns) override;

 private:
  struct Handle {
    size_t bytes;
    PageLocation where;
  };
  struct Mapping {
    size_t bytes;
    PageLocation where;
  };
  // Under mu_: charge the host timeline; start stream work of `ns` (after `link`, if any).
  void charge_locked(double us) { host_ns_ += us * 1e3; }
  double& tail_locked(StreamHandle s) { return stream_tail_[s]; }
  void run_on_stream_locked(StreamHandle s, double ns, double* link);
  // A blocking wait for modeled time `ns`: the host timeline moves there, plus the wake-up.
  void wait_until_locked(double ns);
  // The VMM mapping over `addr` (null: none; pinned and pageable memory are none), and
  // whether there is one of a page located at `where`.
  const Mapping* mapping_at_locked(uintptr_t addr) const;
  bool mapped_at_locked(uintptr_t addr, PageLocation where) const;

  const DriverCosts& costs_;
  mutable std::mutex mu_;  // guards every field below
  double host_ns_ = 0;
  double d2h_link_ns_ = 0, h2d_link_ns_ = 0;
  std::unordered_map<StreamHandle, double> stream_tail_;
  std::unordered_map<EventHandle, double> event_at_;
  std::unordered_map<PageHandle, Handle> handles_;
  std::map<uintptr_t, Mapping> mappings_;  // by address
};

// modeled_host_ns(backend, out) (declared in backend.hpp): the host timeline of `backend` if it
// is a CostModelBackend (false otherwise).

}  // namespace vta
