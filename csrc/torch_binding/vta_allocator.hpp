// The torch-native binding: vtalloc as PyTorch's c10::cuda::CUDACachingAllocator::CUDAAllocator.
//
// Owns: VtaAllocator, the C++ class torch calls for every CUDA allocation once it is installed
// (install.cpp), and per device the list of pools that beginAllocateToPool made active, with
// their stream filters. Every byte it hands out comes from vtalloc's C ABI
// (vtalloc/torch_native.h); it keeps no memory and no statistics of its own.
// Invariants:
//  - Compiled against the user's torch (allocator/torch/binding_build.py builds it), never into the
//    core library; supported torch versions: TORCH_BINDING_MIN .. TORCH_BINDING_MAX below
//    (2.14 and later need C++20 headers: binding_build.py picks the standard).
//  - A failure of the C ABI becomes torch's own exception: c10::OutOfMemoryError for an
//    out-of-memory (after the OutOfMemoryObservers ran), c10::Error otherwise; no exception
//    leaves the extern "C" entry points of install.cpp.
//  - Routing to pools follows PyTorch: the newest active pool whose filter accepts the stream.
#pragma once

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#else
#error "vtalloc's torch binding: torch's version header was not found"
#endif

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "torch_binding/raise.hpp"
#include "vtalloc/torch_native.h"

// The torch versions whose allocator interface this file implements (major * 100 + minor).
#define TORCH_BINDING_MIN 211
#define TORCH_BINDING_MAX 215
#define TORCH_BINDING_VERSION (TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR)
static_assert(TORCH_BINDING_VERSION >= TORCH_BINDING_MIN && TORCH_BINDING_VERSION <= TORCH_BINDING_MAX,
              "vtalloc's torch binding supports torch 2.11 to 2.15");

namespace vta_torch {

namespace cca = c10::cuda::CUDACachingAllocator;

// The deleter of every DataPtr the binding makes: frees through vtalloc, found by address.
void free_block(void* ptr);

// A pool's live blocks at getCheckpointState, for setCheckpointPoolState (cudagraph trees).
struct PoolCheckpoint : cca::AllocatorState {
  c10::DeviceIndex device = 0;
  vta_torch_pool_id_t pool{0, 0};
  std::vector<vta_torch_block_t> live;
};

class VtaAllocator final : public cca::CUDAAllocator {
 public:
  // -- allocation (vta_allocator.cpp) --
  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  bool initialized() override { return initialized_.load(std::memory_order_acquire); }
  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }
  std::string name() override { return "vtalloc"; }

  // -- statistics and inspection (vta_allocator.cpp) --
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;  // no CUDAGuard (raise.hpp)
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override;
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  void emptyCache(c10::MempoolId_t mempool_id) override;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  // History (_record_memory_history / _snapshot's device_traces): vta_history.hpp.
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cca::RecordContext when, bool clearHistory, const std::vector<std::string>& skip_actions) override;
  void setUserMetadata(const std::string& metadata) override;
  std::string getUserMetadata() override;
#if TORCH_BINDING_VERSION >= 214
  bool supportsUserMetadata() override { return true; }
  void annotateMemory(const void* ptr, const std::string& metadata) override;
#endif
  // Trace trackers are torch-internal (its own allocator's observers): none is called here.
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker) override {}
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  // torch 2.12+ declares this pure virtual (OomRejectionObserver); in older torch it is a plain
  // member. vtalloc has no pre-emptive rejection policy, so no such observer is ever called.
  void attachOomRejectionObserver(std::function<void(int64_t, size_t, size_t, size_t)>) {}

  // -- graph-private pools and checkpoints (vta_pools.cpp) --
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override;

  // The pool an allocation on (device, stream) goes to: {0, 0} when no active pool takes it.
  vta_torch_pool_id_t route(c10::DeviceIndex device, cudaStream_t stream);
  // A DataPtr for a block vtalloc handed out (the binding's deleter).
  static c10::DataPtr wrap(void* ptr, c10::DeviceIndex device);

 private:
  void* malloc_or_throw(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream);
  [[noreturn]] void throw_oom(c10::DeviceIndex device, size_t nbytes);

  struct ActivePool {
    vta_torch_pool_id_t id;
    std::function<bool(cudaStream_t)> filter;
  };
  std::mutex pools_mutex_;
  std::vector<std::vector<ActivePool>> active_;  // per device, oldest first
  std::atomic<int> active_count_{0};             // sum of active_'s sizes: the fast path's check

  std::mutex observers_mutex_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;

  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};
};

// Helpers shared by the .cpp files.
inline vta_torch_pool_id_t pool_of(c10::MempoolId_t id) {
  return vta_torch_pool_id_t{static_cast<uint64_t>(id.first), static_cast<uint64_t>(id.second)};
}
// c10::Error with vtalloc's message for `what` when status is not VTA_OK.
void check(vta_status_t status, const char* what);
// The devices that have a vtalloc space now.
std::vector<int32_t> devices_with_space();

}  // namespace vta_torch
