// The torch shim's process-wide state, shared by its two C ABIs: torch_shim.h (the pluggable
// allocator) and torch_native.h (the torch-native binding). Internal: nothing outside csrc/torch
// includes it.
//
// Owns: the declarations of the shim state (Shim) and of what each room of the shim defines
// for the others: the options (torch_shim_options.cpp), the failure records
// (torch_shim_failures.cpp), the state itself, its spaces and parked frees (torch_shim.cpp), the
// region tag of the calling thread (torch_regions.cpp), the allocation body both ABIs share
// (torch_allocate.cpp).
// Invariants: shim() is immortal (see torch_shim.cpp); an out-of-memory is recorded with the
// same fields and message shape whichever ABI saw it (oom_message).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "backend/backend_registry.hpp"
#include "backend/context_guard.hpp"
#include "torch/capture_parking.hpp"
#include "torch/private_pools.hpp"
#include "space/device_spaces.hpp"
#include "vtalloc/torch_native.h"
#include "vtalloc/torch_shim.h"

namespace vta::capi::torch {

enum class FailureKind { oom, capture, other };

// What the shim could not do on one device (vta_torch_failures).
struct FailureRecord {
  std::mutex mu;  // guards the fields below
  vta_torch_failures_t failures{};
  std::string last_message;
};

// What vta_torch_reset_accumulated restarts, per device: the counter values at the last reset.
struct AccumulatedMarks {
  std::mutex mu;  // guards marks
  vta_torch_device_stats_t marks{};
  vta_torch_failures_t failures{};
};

// The options (torch_shim_options.cpp): the defaults, and forgetting the options in force
// (vta_torch_release; the caller holds Shim::mu).
vta_torch_config_t default_config();

struct Shim {
  std::mutex mu;  // the options: configure, get_config, release
  bool configured = false;
  vta_torch_config_t config = default_config();
  std::atomic<uint32_t> on_failure{VTA_TORCH_FAIL_THROW};
  // The configured backend's registry entry (what a space not made yet will need: its context).
  std::atomic<const BackendInfo*> backend{first_device_memory_backend()};
  DeviceSpaces spaces{default_config().space};
  CaptureParking parking;
  PrivatePools pools;
  FailureRecord records[VTA_TORCH_MAX_DEVICES];
  AccumulatedMarks accumulated[VTA_TORCH_MAX_DEVICES];
  std::atomic<uint64_t> limits[VTA_TORCH_MAX_DEVICES] = {};  // set_limit before the space exists (0: none)
};

void forget_options_locked(Shim& s);

// The state, its spaces and parked frees (torch_shim.cpp).
Shim& shim();
// The space of a device, which must exist already (only allocation creates spaces).
AddressSpace& existing_space(int device, const std::string& why);
// The space of a device, created on first use (with the limit set for it, if any).
AddressSpace& space_for(int device);
// Free what was parked during a capture on `device`, once its stream no longer captures.
void flush_parked(int device, AddressSpace& space);

// The key of a graph-private pool's id.
inline PrivatePools::Id pool_key(vta_torch_pool_id_t id) { return {id.first, id.second}; }

// Which torch ABI allocates: the pluggable allocator (torch_shim.h) or the torch-native one
// (torch_native.h). They differ only in what a refused capture tells the user.
enum class TorchAbi { pluggable, native };

// The one allocation body of both ABIs (torch_allocate.cpp): the address of a block of `size`
// bytes on `device` for `stream`, in graph-private pool `pool` when it names one (native only;
// null: none). On failure the failure is recorded, its message written to *failure, and the
// exception rethrown: an out-of-memory as vta::OutOfMemory carrying that message.
uintptr_t torch_allocate(uint64_t size, int device, void* stream, const vta_torch_pool_id_t* pool, TorchAbi abi,
                         std::string* failure);

// The region tag the calling thread's torch allocations carry (torch_regions.cpp; 0: none).
uint32_t current_region();

// The failure records (torch_shim_failures.cpp).
// "CUDA out of memory (vtalloc, device N): ... ": what an OOM says, whichever ABI saw it.
std::string oom_message(int device, const vta::OutOfMemory& e);
void record_failure(int device, FailureKind kind, const std::string& message, const vta::OutOfMemory* oom);
void record_free_failure(int device, const std::string& message) noexcept;
void count_deferred_free(int device);
// Every device's record back to zero (vta_torch_release).
void forget_failures();

// Runs `body(space)` for `device`'s space (the ordinal checked), the calling thread's context
// restored after it where its backend needs a context;
// false, running nothing, when the device has no space yet.
template <typename F>
bool with_space(int32_t device, F&& body) {
  DeviceSpaces::check_device(device);
  AddressSpace* space = shim().spaces.get(device);
  if (!space) return false;
  ContextGuard guard(&space->backend_info());
  body(*space);
  return true;
}

// Runs `body(d, space)` for `device`'s space, or for every space when device is -1.
template <typename F>
void for_devices(int32_t device, F&& body) {
  if (device != -1) DeviceSpaces::check_device(device);
  for (int d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
    if (device == -1 || d == device) with_space(d, [&](AddressSpace& space) { body(d, space); });
  }
}

}  // namespace vta::capi::torch
