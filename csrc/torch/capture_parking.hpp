// CaptureParking: frees that arrive while their stream is capturing a CUDA graph, per device.
//
// Owns: the parked frees (address, stream) of each device ordinal and their count. A free
// records an event on its stream; on a capturing stream that event would become part of the
// graph, so the torch shim parks the free and does it once the stream no longer captures.
// Invariants: a parked address is freed at most once, by flush(); parked(device) is the
// number of frees parked there (an atomic read, for the allocation fast path and release).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "space/address_space.hpp"
#include "backend/backend.hpp"
#include "space/device_spaces.hpp"

namespace vta::capi {

// Whether `stream` of a space of `backend_kind` is capturing a graph (false when the driver
// cannot be asked; host streams never capture).
bool stream_capturing(int backend_kind, void* stream);

class CaptureParking {
 public:
  // Parks the free of `address` (device in range); the caller checked the stream captures.
  void park(int device, uintptr_t address, void* stream);
  // Frees into `space` what was parked for `device` on streams that no longer capture; returns
  // a message for each free that failed (the address is forgotten all the same).
  std::vector<std::string> flush(int device, AddressSpace& space);
  size_t parked(int device) const { return slots_[device].count.load(std::memory_order_acquire); }

 private:
  struct Parked {
    uintptr_t address;
    void* stream;
  };
  struct Slot {
    std::atomic<size_t> count{0};
    std::mutex mu;  // guards parked
    std::vector<Parked> parked;
  };
  Slot slots_[DeviceSpaces::kMaxDevices];
};

}  // namespace vta::capi
