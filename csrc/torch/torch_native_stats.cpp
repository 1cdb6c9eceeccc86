// The torch-native ABI's statistics (torch_native.h): PyTorch's (current, peak, allocated,
// freed) quadruples assembled from a space's stats, and the accumulated counts' restart.
//
// Owns: the mapping of vta_stats_t onto vta_torch_device_stats_t (raw_stats: accumulated columns
// counted since the space's creation), the marks vta_torch_reset_accumulated sets (each
// device's AccumulatedMarks, under its mutex) and their subtraction, and the two entry points.
// Invariants: reading changes nothing; a device without a space reads all zero; the marks are
// forgotten with the spaces (vta_torch_release).
#include <algorithm>
#include <mutex>

#include "capi/guard.hpp"
#include "torch/torch_shim_state.hpp"

using namespace vta::capi::torch;  // NOLINT(google-build-using-namespace)
using vta::AddressSpace;
using vta::capi::guarded;
using vta::capi::need;

namespace {

vta_torch_stat_t stat(uint64_t current, uint64_t peak, uint64_t allocated, uint64_t freed) {
  return vta_torch_stat_t{static_cast<int64_t>(current), static_cast<int64_t>(std::max(peak, current)),
                          static_cast<int64_t>(allocated), static_cast<int64_t>(freed)};
}

// A device's statistics, accumulated columns counted since the space's creation.
vta_torch_device_stats_t raw_stats(int device, AddressSpace& space) {
  vta_stats_t s = space.stats();
  vta_torch_device_stats_t out{};
  out.struct_size = sizeof out;
  const uint64_t page = s.page_bytes;
  out.allocation[0] = stat(s.num_live_allocs, s.num_live_allocs, s.num_allocs, s.num_frees);
  out.allocated_bytes[0] = stat(s.active_bytes, s.peak_active_bytes, s.allocated_bytes_total, s.freed_bytes_total);
  out.requested_bytes[0] =
      stat(s.allocated_bytes, s.peak_allocated_bytes, s.requested_bytes_total, s.requested_freed_bytes_total);
  out.active_bytes[0] = stat(s.active_bytes + s.pending_free_bytes, s.peak_active_bytes, s.allocated_bytes_total,
                             s.freed_bytes_total);
  out.reserved_bytes[0] = stat(s.pages_total * page, s.peak_pages_total * page, s.page_bytes_created_total,
                               s.page_bytes_released_total);
  out.segment[0] = stat(s.pages_total, s.peak_pages_total, page ? s.page_bytes_created_total / page : 0,
                        page ? s.page_bytes_released_total / page : 0);
  // Small and large: current only (the space keeps no per-class history).
  uint64_t n[2] = {0, 0}, bytes[2] = {0, 0}, req[2] = {0, 0};
  for (auto& [address, a] : space.records()) {
    if (a.kept) continue;
    int k = a.small ? 0 : 1;
    n[k]++;
    bytes[k] += a.size;
    req[k] += a.requested;
  }
  for (int k = 0; k < 2; ++k) {
    out.allocation[1 + k] = stat(n[k], n[k], 0, 0);
    out.allocated_bytes[1 + k] = stat(bytes[k], bytes[k], 0, 0);
    out.requested_bytes[1 + k] = stat(req[k], req[k], 0, 0);
    out.active_bytes[1 + k] = stat(bytes[k], bytes[k], 0, 0);
  }
  out.num_alloc_retries = static_cast<int64_t>(s.num_alloc_retries);
  out.num_ooms = static_cast<int64_t>(s.num_ooms);
  out.num_sync_all_streams = static_cast<int64_t>(s.num_sync_all_streams);
  out.num_device_alloc = static_cast<int64_t>(s.num_map_calls);
  out.num_device_free = static_cast<int64_t>(s.num_unmap_calls);
  out.pool_reserved_bytes = shim().pools.reserved_bytes(device);
  return out;
}

void subtract_marks(vta_torch_device_stats_t* s, const vta_torch_device_stats_t& m) {
  vta_torch_stat_t* cols[] = {s->allocation, s->allocated_bytes, s->requested_bytes, s->active_bytes, s->reserved_bytes,
                              s->segment};
  const vta_torch_stat_t* marks[] = {m.allocation, m.allocated_bytes, m.requested_bytes, m.active_bytes, m.reserved_bytes,
                                     m.segment};
  for (int c = 0; c < 6; ++c)
    for (int k = 0; k < 3; ++k) {
      cols[c][k].allocated -= marks[c][k].allocated;
      cols[c][k].freed -= marks[c][k].freed;
    }
  s->num_alloc_retries -= m.num_alloc_retries;
  s->num_ooms -= m.num_ooms;
  s->num_sync_all_streams -= m.num_sync_all_streams;
  s->num_device_alloc -= m.num_device_alloc;
  s->num_device_free -= m.num_device_free;
}

}  // namespace

extern "C" {

vta_status_t vta_torch_device_stats(int32_t device, vta_torch_device_stats_t* out) {
  return guarded([&] {
    need(out, "output");
    *out = vta_torch_device_stats_t{};
    out->struct_size = sizeof *out;
    with_space(device, [&](AddressSpace& space) {
      vta_torch_device_stats_t s = raw_stats(device, space);
      AccumulatedMarks& m = shim().accumulated[device];
      std::lock_guard<std::mutex> lk(m.mu);
      subtract_marks(&s, m.marks);
      *out = s;
    });
  });
}

vta_status_t vta_torch_reset_accumulated(int32_t device) {
  return guarded([&] {
    for_devices(device, [](int d, AddressSpace& space) {
      vta_torch_device_stats_t s = raw_stats(d, space);
      AccumulatedMarks& m = shim().accumulated[d];
      std::lock_guard<std::mutex> lk(m.mu);
      m.marks = s;
    });
  });
}

}  // extern "C"
