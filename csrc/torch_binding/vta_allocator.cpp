// The torch-native binding's allocation, statistics and inspection: each CUDAAllocator call
// turned into calls of vtalloc's torch-native C ABI.
//
// Owns: nothing beyond VtaAllocator's members (vta_allocator.hpp).
// Invariants:
//  - A zero-byte request gets a null DataPtr on the current device and never reaches vtalloc.
//  - Out-of-memory: the observers run, then c10::OutOfMemoryError is thrown with vtalloc's
//    numbers (vta_torch_failures: requested, capacity, mapped) and its message.
//  - record_stream on a DataPtr this binding did not make is ignored, as torch's allocator does.
//  - snapshot() reports one segment per vtalloc block with the block's own fields, and the
//    history recordHistory asked for (vta_history.hpp); it invents nothing.
#include "torch_binding/vta_allocator.hpp"
#include "torch_binding/vta_history.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <utility>

namespace vta_torch {

void free_block(void* ptr) {
  if (ptr == nullptr) return;
  if (!history().enabled()) {
    (void)vta_torch_free_ptr(ptr, nullptr);  // failures are counted by vtalloc
    return;
  }
  void* base = nullptr;
  uint64_t size = 0;  // for a block allocated before recording began (History keeps the others')
  (void)vta_torch_base_allocation(ptr, &base, &size);
  int32_t device = 0;
  if (vta_torch_free_ptr(ptr, &device) == VTA_OK) {
    history().on_free(static_cast<c10::DeviceIndex>(device), ptr, static_cast<size_t>(size));
  }
}

void check(vta_status_t status, const char* what) {
  if (status == VTA_OK) return;
  const char* message = vta_torch_last_error();
  VTA_RAISE("vtalloc: ", what, " failed: ", message ? message : "(no message)");
}

std::vector<int32_t> devices_with_space() {
  uint64_t mask = 0;
  std::vector<int32_t> out;
  if (vta_torch_devices(&mask) != VTA_OK) return out;
  for (int32_t d = 0; d < VTA_TORCH_MAX_DEVICES; ++d) {
    if (mask & (uint64_t{1} << d)) out.push_back(d);
  }
  return out;
}

namespace {

c10::DeviceIndex current_device() {
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return device;
}

void fill(c10::CachingDeviceAllocator::StatArray& out, const vta_torch_stat_t (&in)[3]) {
  for (size_t i = 0; i < 3; ++i) {
    out[i].current = in[i].current;
    out[i].peak = in[i].peak;
    out[i].allocated = in[i].allocated;
    out[i].freed = in[i].freed;
  }
}

// The current CUDA device set to `device` for a scope, then put back. torch's CUDAGuard would do,
// but its inline error paths format numbers through c10::str (raise.hpp).
class DeviceScope {
 public:
  explicit DeviceScope(c10::DeviceIndex device) {
    C10_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      C10_CUDA_CHECK(cudaSetDevice(device));
      changed_ = true;
    }
  }
  ~DeviceScope() {
    if (changed_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

std::pair<size_t, size_t> device_memory(c10::DeviceIndex device) {
  DeviceScope scope(device);
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return {free, total};
}

size_t device_total(c10::DeviceIndex device) { return device_memory(device).second; }

}  // namespace

c10::DataPtr VtaAllocator::wrap(void* ptr, c10::DeviceIndex device) {
  return c10::DataPtr(ptr, ptr, &free_block, c10::Device(c10::DeviceType::CUDA, device));
}

void VtaAllocator::init(int device_count) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  if (active_.size() < static_cast<size_t>(device_count)) active_.resize(device_count);
  initialized_.store(true, std::memory_order_release);
}

void VtaAllocator::throw_oom(c10::DeviceIndex device, size_t nbytes) {
  vta_torch_failures_t f{};
  f.struct_size = sizeof f;
  char message[1024] = {0};
  (void)vta_torch_failures(device, &f, message, sizeof message);
  vta_torch_device_stats_t s{};
  s.struct_size = sizeof s;
  (void)vta_torch_device_stats(device, &s);
  size_t free = 0, total = 0;
  try {
    std::tie(free, total) = device_memory(device);
  } catch (const c10::Error&) {  // the out-of-memory error below says more than a failed query
    free = total = 0;
  }
  std::vector<cca::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    observers = oom_observers_;
  }
  for (const auto& observer : observers) {
    observer(device, static_cast<size_t>(s.allocated_bytes[0].current), total, free);
  }
  const uint64_t requested = f.last_oom_requested_bytes ? f.last_oom_requested_bytes : nbytes;
  history().on_oom(device, static_cast<size_t>(requested), free, nullptr);
  VTA_RAISE_OOM("CUDA out of memory (vtalloc, device ", static_cast<int>(device), "): tried to allocate ",
                bytes_text(requested), "; vtalloc's capacity on this device is ", bytes_text(f.last_oom_capacity_bytes),
                ", of which ", bytes_text(f.last_oom_mapped_bytes), " is mapped. ", message[0] ? message : "",
                message[0] ? "" : "Free tensors you no longer need, lower the batch size, or raise the capacity "
                                  "(VTALLOC_CAPACITY or enable(capacity=...))");
}

void* VtaAllocator::malloc_or_throw(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream) {
  const vta_torch_pool_id_t pool = route(device, stream);
  const bool in_pool = pool.first != 0 || pool.second != 0;
  void* out = nullptr;
  const vta_status_t status = vta_torch_malloc(nbytes, device, stream, in_pool ? &pool : nullptr, &out);
  if (status == VTA_OK) {
    if (history().enabled()) {
      history().on_alloc(device, out, nbytes, stream, c10::MempoolId_t{static_cast<c10::CaptureId_t>(pool.first),
                                                                        static_cast<c10::CaptureId_t>(pool.second)});
    }
    return out;
  }
  if (status == VTA_ERR_OUT_OF_MEMORY) throw_oom(device, nbytes);
  check(status, "allocation");
  return nullptr;
}

c10::DataPtr VtaAllocator::allocate(size_t n) {
  const c10::DeviceIndex device = current_device();
  if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CUDA, device));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  return wrap(malloc_or_throw(n, device, stream), device);
}

void VtaAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

void* VtaAllocator::raw_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const c10::DeviceIndex device = current_device();
  return malloc_or_throw(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* VtaAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  return malloc_or_throw(nbytes, current_device(), stream);
}

void VtaAllocator::raw_delete(void* ptr) {
  if (ptr == nullptr) return;
  if (!history().enabled()) {
    check(vta_torch_free_ptr(ptr, nullptr), "raw_delete");
    return;
  }
  void* base = nullptr;
  uint64_t size = 0;
  (void)vta_torch_base_allocation(ptr, &base, &size);
  int32_t device = 0;
  check(vta_torch_free_ptr(ptr, &device), "raw_delete");
  history().on_free(static_cast<c10::DeviceIndex>(device), ptr, static_cast<size_t>(size));
}

bool VtaAllocator::isHistoryEnabled() { return history().enabled(); }

void VtaAllocator::recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                                 cca::RecordContext when, bool clearHistory,
                                 const std::vector<std::string>& skip_actions) {
  history().configure(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory, skip_actions);
}

void VtaAllocator::setUserMetadata(const std::string& metadata) { history().set_user_metadata(metadata); }

std::string VtaAllocator::getUserMetadata() { return history().user_metadata(); }

#if TORCH_BINDING_VERSION >= 214
void VtaAllocator::annotateMemory(const void* ptr, const std::string& metadata) {
  history().on_annotate(reinterpret_cast<uintptr_t>(ptr), metadata);
}
#endif

void VtaAllocator::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

c10::CachingDeviceAllocator::DeviceStats VtaAllocator::getDeviceStats(c10::DeviceIndex device) {
  vta_torch_device_stats_t s{};
  s.struct_size = sizeof s;
  check(vta_torch_device_stats(device, &s), "device statistics");
  c10::CachingDeviceAllocator::DeviceStats out;
  fill(out.allocation, s.allocation);
  fill(out.active, s.allocation);  // vtalloc counts no "active" blocks apart from live ones
  fill(out.segment, s.segment);
  fill(out.allocated_bytes, s.allocated_bytes);
  fill(out.requested_bytes, s.requested_bytes);
  fill(out.active_bytes, s.active_bytes);
  fill(out.reserved_bytes, s.reserved_bytes);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_sync_all_streams = s.num_sync_all_streams;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  return out;  // inactive_split*, oversize_*: vtalloc does not split blocks; they stay 0
}

std::pair<size_t, size_t> VtaAllocator::getMemoryInfo(c10::DeviceIndex device) { return device_memory(device); }

void VtaAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  check(vta_torch_reset_accumulated(device), "resetAccumulatedStats");
}

void VtaAllocator::resetPeakStats(c10::DeviceIndex device) {
  check(vta_torch_reset_peak_stats(device), "resetPeakStats");
}

void VtaAllocator::cacheInfo(c10::DeviceIndex device, size_t* largestBlock) {
  uint64_t bytes = 0;
  check(vta_torch_largest_allocatable(device, &bytes), "cacheInfo");
  *largestBlock = static_cast<size_t>(bytes);
}

void* VtaAllocator::getBaseAllocation(void* ptr, size_t* size) {
  void* base = nullptr;
  uint64_t n = 0;
  check(vta_torch_base_allocation(ptr, &base, &n), "getBaseAllocation");
  if (size != nullptr) *size = static_cast<size_t>(n);
  return base;
}

cca::SnapshotInfo VtaAllocator::snapshot(c10::MempoolId_t mempool_id, bool /*include_traces*/) {
  cca::SnapshotInfo out;
  const vta_torch_pool_id_t pool = pool_of(mempool_id);
  const bool one_pool = pool.first != 0 || pool.second != 0;
  for (int32_t device : devices_with_space()) {
    uint64_t count = 0;
    std::vector<vta_torch_block_t> blocks;
    // The block count may grow between the two calls: ask again until it fits.
    for (int attempt = 0; attempt < 8; ++attempt) {
      check(vta_torch_blocks(device, one_pool ? &pool : nullptr, blocks.data(), blocks.size(), &count), "snapshot");
      if (count <= blocks.size()) break;
      blocks.resize(count + 16);
    }
    blocks.resize(std::min<uint64_t>(count, blocks.size()));
    for (const auto& b : blocks) {
      const bool live = (b.state & VTA_TORCH_BLOCK_LIVE) != 0;
      c10::CachingDeviceAllocator::SegmentInfo seg;
      seg.device = static_cast<c10::DeviceIndex>(device);
      seg.address = static_cast<size_t>(b.address);
      seg.total_size = static_cast<size_t>(b.size);
      seg.requested_size = static_cast<size_t>(b.requested);
      seg.allocated_size = live ? static_cast<size_t>(b.size) : 0;
      seg.active_size = seg.allocated_size;
      seg.stream = reinterpret_cast<void*>(static_cast<uintptr_t>(b.stream));
      seg.is_large = b.small == 0;
      seg.is_expandable = false;
      seg.owner_private_pool_id = c10::MempoolId_t{b.pool.first, b.pool.second};
      c10::CachingDeviceAllocator::BlockInfo block;
      block.size = seg.total_size;
      block.requested_size = seg.requested_size;
      block.allocated = live;
      block.active = live;
      if (live) block.context_when_allocated = history().context_of(b.address);
      seg.blocks.push_back(std::move(block));
      out.segments.push_back(std::move(seg));
    }
  }
  out.device_traces.resize(static_cast<size_t>(std::max<int>(0, c10::cuda::device_count())));
  for (size_t d = 0; d < out.device_traces.size(); ++d) {
    out.device_traces[d] = history().trace(static_cast<c10::DeviceIndex>(d));
  }
  return out;
}

double VtaAllocator::getMemoryFraction(c10::DeviceIndex device) {
  uint64_t limit = 0;
  check(vta_torch_get_limit(device, &limit), "getMemoryFraction");
  const size_t total = device_total(device);
  return total == 0 ? 1.0 : std::min(1.0, static_cast<double>(limit) / static_cast<double>(total));
}

void VtaAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  VTA_CHECK(fraction >= 0.0 && fraction <= 1.0, "vtalloc: memory fraction must be in [0, 1], got ", fraction);
  const size_t total = device_total(device);
  // 0 lifts vtalloc's cap: a fraction of 1 does; any smaller one caps at 1 byte or more.
  const uint64_t bytes =
      fraction >= 1.0 ? 0 : std::max<uint64_t>(1, static_cast<uint64_t>(fraction * static_cast<double>(total)));
  check(vta_torch_set_limit(device, bytes), "setMemoryFraction");
}

void VtaAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  const vta_torch_pool_id_t pool = pool_of(mempool_id);
  if (pool.first == 0 && pool.second == 0) {
    check(vta_torch_trim(-1, nullptr), "emptyCache");
    return;
  }
  // A pool lives on the devices it was used on; on the others it does not exist (not an error).
  for (int32_t device : devices_with_space()) {
    int32_t users = 0;
    if (vta_torch_pool_use_count(device, pool, &users) != VTA_OK) continue;
    (void)vta_torch_pool_empty(device, pool, nullptr);  // a pool with users keeps its blocks
  }
}

void VtaAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  if (ptr.get() == nullptr || ptr.get_deleter() != &free_block) return;  // not ours: ignored, as torch does
  check(vta_torch_record_stream(ptr.get(), stream.stream()), "recordStream");
}

void VtaAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  DeviceScope scope(dev);
  const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return;
  }
  C10_CUDA_CHECK(err);
}

cudaError_t VtaAllocator::memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                      cudaStream_t stream, bool /*p2p_enabled*/) {
  // vtalloc's memory is mapped with cuMemMap: peer access to it is not granted by
  // cudaDeviceEnablePeerAccess, so a copy between devices always takes the peer path.
  if (dstDevice == srcDevice) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
}

cca::ShareableHandle VtaAllocator::shareIpcHandle(void*) {
  VTA_RAISE("vtalloc: CUDA IPC of vtalloc memory is not supported (the tensor cannot be shared with another "
                   "process through torch.multiprocessing); copy it to a CPU tensor, or run the process that "
                   "shares CUDA tensors without vtalloc.allocator.torch.enable()");
}

std::shared_ptr<void> VtaAllocator::getIpcDevPtr(std::string) {
  VTA_RAISE("vtalloc: CUDA IPC of vtalloc memory is not supported (opening another process's CUDA tensor "
                   "under vtalloc.allocator.torch.enable())");
}

}  // namespace vta_torch
