// CaptureParking (capture_parking.hpp): parking and flushing frees around CUDA graph capture.
//
// Owns: nothing beyond the class. Invariant: the lock of a device's parked frees is never held
// while freeing into its space (flush takes the ready ones out first).
#include "torch/capture_parking.hpp"

#include <exception>

namespace vta::capi {

bool stream_capturing(int backend_kind, void* stream) {
  bool capturing = false;
  Status s = Backend::stream_is_capturing(backend_kind, reinterpret_cast<StreamHandle>(stream), &capturing);
  return s.is_ok() && capturing;
}

void CaptureParking::park(int device, uintptr_t address, void* stream) {
  Slot& slot = slots_[device];
  std::lock_guard<std::mutex> lk(slot.mu);
  slot.parked.push_back(Parked{address, stream});
  slot.count.store(slot.parked.size(), std::memory_order_release);
}

std::vector<std::string> CaptureParking::flush(int device, AddressSpace& space) {
  Slot& slot = slots_[device];
  std::vector<std::string> errors;
  if (slot.count.load(std::memory_order_acquire) == 0) return errors;
  std::vector<Parked> ready;
  {
    std::lock_guard<std::mutex> lk(slot.mu);
    size_t keep = 0;
    for (const Parked& p : slot.parked) {
      if (stream_capturing(space.backend_kind(), p.stream))
        slot.parked[keep++] = p;
      else
        ready.push_back(p);
    }
    slot.parked.resize(keep);
    slot.count.store(keep, std::memory_order_release);
  }
  for (const Parked& p : ready) {
    try {
      space.free(p.address);
    } catch (const std::exception& e) {
      errors.push_back(std::string("vtalloc: deferred free failed: ") + e.what());
    }
  }
  return errors;
}

}  // namespace vta::capi
