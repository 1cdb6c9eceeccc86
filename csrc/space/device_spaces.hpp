// DeviceSpaces: one lazily created AddressSpace per device ordinal, all with the same options.
//
// Owns: the options of the spaces (a vta_config_t whose device is replaced by each ordinal),
// the published space of each device, and every space it ever created. Knows nothing of
// torch: the torch shim (torch/torch_shim.cpp) is its user, with the device ordinals torch
// passes.
// Invariants: a space pointer, once published, stays valid for the life of this object
// (release() closes the spaces but keeps the objects: a racing caller may still hold one); the
// options change only while no space exists; get() is one atomic load (the allocation fast
// path), creation and release take the mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "space/address_space.hpp"
#include "backend/status.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

class DeviceSpaces {
 public:
  static constexpr int kMaxDevices = 64;  // device ordinals 0..63; bit d of mask() is device d

  explicit DeviceSpaces(const vta_config_t& config) : config_(config) {}
  DeviceSpaces(const DeviceSpaces&) = delete;
  DeviceSpaces& operator=(const DeviceSpaces&) = delete;

  // InvalidArgument unless 0 <= device < kMaxDevices.
  static void check_device(int device);

  // The published space of `device`, or nullptr (device must be in range).
  AddressSpace* get(int device) const { return slots_[device].load(std::memory_order_acquire); }
  // The space of `device`, created with the options on first use (device must be in range).
  AddressSpace* get_or_create(int device);
  uint64_t mask() const;
  bool any() const { return mask() != 0; }

  // Sets the options of the spaces created from now on. While a space exists the options are
  // fixed: returns false (nothing changed) unless the caller says they are `unchanged`.
  bool configure(const vta_config_t& config, bool unchanged);

  // Closes every space and unpublishes it, once none has a live allocation: `extra_live(d)`
  // counts allocations of device d the caller holds outside the space (frees it parked).
  // Otherwise throws InvalidArgument naming `owner` and the device, and nothing changed. The
  // options become `reset_to`. Returns the first error of close(): every space was closed and
  // unpublished all the same.
  template <typename ExtraLive>
  Status release(const std::string& owner, ExtraLive&& extra_live, const vta_config_t& reset_to);

 private:
  void check_idle_locked(const std::string& owner, int device, uint64_t extra) const;
  Status close_all_locked(const vta_config_t& reset_to);

  mutable std::mutex mu_;  // options, creation, release
  vta_config_t config_;
  std::atomic<AddressSpace*> slots_[kMaxDevices] = {};
  std::vector<std::unique_ptr<AddressSpace>> created_;  // every space made: closed, never freed
};

template <typename ExtraLive>
Status DeviceSpaces::release(const std::string& owner, ExtraLive&& extra_live, const vta_config_t& reset_to) {
  std::lock_guard<std::mutex> lk(mu_);
  for (int d = 0; d < kMaxDevices; ++d)
    if (get(d)) check_idle_locked(owner, d, static_cast<uint64_t>(extra_live(d)));
  return close_all_locked(reset_to);
}

}  // namespace vta
