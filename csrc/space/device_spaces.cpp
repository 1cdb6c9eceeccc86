// DeviceSpaces (device_spaces.hpp): creation, options and release of the per-device spaces.
//
// Owns: nothing beyond the class. Invariant: a space is published (slots_) only after it was
// created whole, and unpublished before it is closed.
#include "space/device_spaces.hpp"

namespace vta {

void DeviceSpaces::check_device(int device) {
  if (device < 0 || device >= kMaxDevices)
    fail(VTA_ERR_INVALID_ARGUMENT, "device " + std::to_string(device) + " is out of range (vtalloc serves 0.." +
                                       std::to_string(kMaxDevices - 1) + ")");
}

AddressSpace* DeviceSpaces::get_or_create(int device) {
  AddressSpace* space = get(device);
  if (space) return space;
  std::lock_guard<std::mutex> lk(mu_);
  space = get(device);
  if (space) return space;
  vta_config_t c = config_;
  c.device = device;
  created_.push_back(AddressSpace::create(c));
  space = created_.back().get();
  slots_[device].store(space, std::memory_order_release);
  return space;
}

uint64_t DeviceSpaces::mask() const {
  uint64_t m = 0;
  for (int d = 0; d < kMaxDevices; ++d)
    if (get(d)) m |= 1ull << d;
  return m;
}

bool DeviceSpaces::configure(const vta_config_t& config, bool unchanged) {
  std::lock_guard<std::mutex> lk(mu_);
  if (any()) return unchanged;
  config_ = config;
  return true;
}

void DeviceSpaces::check_idle_locked(const std::string& owner, int device, uint64_t extra) const {
  uint64_t live = get(device)->stats().num_live_allocs + extra;
  if (live)
    fail(VTA_ERR_INVALID_ARGUMENT, "cannot release " + owner + ": device " + std::to_string(device) + " still has " +
                                       std::to_string(live) + " live allocation(s)");
}

Status DeviceSpaces::close_all_locked(const vta_config_t& reset_to) {
  Status first_error;
  for (auto& slot : slots_) {
    AddressSpace* space = slot.exchange(nullptr, std::memory_order_acq_rel);
    if (!space) continue;
    try {
      space->close();
    } catch (const Error& e) {
      if (first_error.is_ok()) first_error = Status(e.code(), e.what());
    }
  }
  config_ = reset_to;
  return first_error;
}

}  // namespace vta
