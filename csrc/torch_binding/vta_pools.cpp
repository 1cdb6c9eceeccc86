// The torch-native binding's graph-private pools: PyTorch's CUDAGraph / MemPool / cudagraph-trees
// calls on top of vtalloc's pools (vta_torch_pool_*), and the routing of allocations to them.
//
// Owns: the per-device list of active pools (beginAllocateToPool .. endAllocateToPool) with
// their stream filters; the pools themselves, their use counts and blocks are vtalloc's.
// Invariants:
//  - beginAllocateToPool adds a user to the pool (as createOrIncrefPool), endAllocateToPool
//    only stops routing to it, releasePool drops a user: PyTorch's lifecycle.
//  - route() takes the newest active pool whose filter accepts the stream; with no active pool
//    anywhere it costs one atomic load.
//  - setCheckpointPoolState changes nothing when vtalloc refuses the new live set.
#include "torch_binding/vta_allocator.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

namespace vta_torch {

namespace {

bool same(const vta_torch_pool_id_t& a, const vta_torch_pool_id_t& b) {
  return a.first == b.first && a.second == b.second;
}

// The blocks of one pool on one device (live and cached).
std::vector<vta_torch_block_t> pool_blocks(c10::DeviceIndex device, const vta_torch_pool_id_t& pool) {
  std::vector<vta_torch_block_t> blocks;
  uint64_t count = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    check(vta_torch_blocks(device, &pool, blocks.data(), blocks.size(), &count), "listing a pool's blocks");
    if (count <= blocks.size()) break;
    blocks.resize(count + 16);
  }
  blocks.resize(std::min<uint64_t>(count, blocks.size()));
  return blocks;
}

}  // namespace

vta_torch_pool_id_t VtaAllocator::route(c10::DeviceIndex device, cudaStream_t stream) {
  if (active_count_.load(std::memory_order_acquire) == 0) return {0, 0};
  std::lock_guard<std::mutex> lock(pools_mutex_);
  if (static_cast<size_t>(device) >= active_.size()) return {0, 0};
  const auto& pools = active_[device];
  for (auto it = pools.rbegin(); it != pools.rend(); ++it) {
    if (it->filter(stream)) return it->id;
  }
  return {0, 0};
}

void VtaAllocator::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                       std::function<bool(cudaStream_t)> filter) {
  const vta_torch_pool_id_t pool = pool_of(mempool_id);
  std::lock_guard<std::mutex> lock(pools_mutex_);
  if (active_.size() <= static_cast<size_t>(device)) active_.resize(device + 1);
  for (const auto& p : active_[device]) {
    VTA_CHECK(!same(p.id, pool), "vtalloc: beginAllocateToPool: already allocating to pool (", pool.first, ", ",
                pool.second, ") on device ", static_cast<int>(device));
  }
  check(vta_torch_pool_incref(device, pool), "beginAllocateToPool");
  active_[device].push_back(ActivePool{pool, std::move(filter)});
  active_count_.fetch_add(1, std::memory_order_release);
}

void VtaAllocator::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  const vta_torch_pool_id_t pool = pool_of(mempool_id);
  std::lock_guard<std::mutex> lock(pools_mutex_);
  if (static_cast<size_t>(device) >= active_.size()) return;
  auto& pools = active_[device];
  auto it = std::find_if(pools.begin(), pools.end(), [&](const ActivePool& p) { return same(p.id, pool); });
  VTA_CHECK(it != pools.end(), "vtalloc: endAllocateToPool: pool (", pool.first, ", ", pool.second,
              ") is not being allocated to on device ", static_cast<int>(device));
  pools.erase(it);
  active_count_.fetch_sub(1, std::memory_order_release);
}

void VtaAllocator::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  check(vta_torch_pool_release(device, pool_of(mempool_id)), "releasePool");
}

void VtaAllocator::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                      std::shared_ptr<cca::CUDAAllocator> allocator) {
  VTA_CHECK(allocator == nullptr || allocator.get() == this,
              "vtalloc: a torch.cuda.MemPool with its own allocator cannot be used while vtalloc is torch's "
              "allocator (its memory would come from outside vtalloc); create torch.cuda.MemPool() without one");
  check(vta_torch_pool_incref(device, pool_of(mempool_id)), "createOrIncrefPool");
}

int VtaAllocator::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  int32_t users = 0;
  check(vta_torch_pool_use_count(device, pool_of(mempool_id), &users), "getPoolUseCount");
  return users;
}

// use_on_oom: PyTorch may take a pool's free blocks for an allocation outside it when out of
// memory. vtalloc's allocations outside pools already reclaim every page it can; a pool's
// cached blocks stay its own. Accepted, no effect.
void VtaAllocator::setUseOnOOM(c10::DeviceIndex, c10::MempoolId_t, bool) {}

// no_split: vtalloc never splits a block between allocations, so every pool behaves so already.
void VtaAllocator::setNoSplit(c10::DeviceIndex, c10::MempoolId_t) {}

bool VtaAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                            const std::unordered_set<void*>& expected_live_allocations) {
  size_t live = 0;
  for (const auto& b : pool_blocks(device, pool_of(mempool_id))) {
    if ((b.state & VTA_TORCH_BLOCK_LIVE) == 0) continue;
    ++live;
    if (expected_live_allocations.count(reinterpret_cast<void*>(static_cast<uintptr_t>(b.address))) == 0) {
      return false;
    }
  }
  return live == expected_live_allocations.size();
}

std::shared_ptr<cca::AllocatorState> VtaAllocator::getCheckpointState(c10::DeviceIndex device,
                                                                      c10::MempoolId_t id) {
  auto state = std::make_shared<PoolCheckpoint>();
  state->device = device;
  state->pool = pool_of(id);
  for (const auto& b : pool_blocks(device, state->pool)) {
    if (b.state & VTA_TORCH_BLOCK_LIVE) state->live.push_back(b);
  }
  return state;
}

cca::CheckpointDelta VtaAllocator::setCheckpointPoolState(c10::DeviceIndex device,
                                                          std::shared_ptr<cca::AllocatorState> pps) {
  auto state = std::dynamic_pointer_cast<PoolCheckpoint>(pps);
  VTA_CHECK(state != nullptr, "vtalloc: setCheckpointPoolState got a state that vtalloc did not make");
  VTA_CHECK(state->device == device, "vtalloc: setCheckpointPoolState: the state is of device ",
              static_cast<int>(state->device), ", not ", static_cast<int>(device));
  std::vector<uint64_t> live;
  live.reserve(state->live.size());
  for (const auto& b : state->live) live.push_back(b.address);
  const size_t capacity = pool_blocks(device, state->pool).size() + live.size();
  std::vector<uint64_t> freed(capacity), allocated(capacity);
  uint64_t n_freed = 0, n_allocated = 0;
  check(vta_torch_pool_set_live(device, state->pool, live.data(), live.size(), freed.data(), freed.size(), &n_freed,
                                allocated.data(), allocated.size(), &n_allocated),
        "setCheckpointPoolState");
  cca::CheckpointDelta delta;
  for (uint64_t i = 0; i < n_freed; ++i) delta.ptrs_freed.push_back(reinterpret_cast<void*>(freed[i]));
  for (uint64_t i = 0; i < n_allocated; ++i) {
    delta.dataptrs_allocd.push_back(wrap(reinterpret_cast<void*>(allocated[i]), device));
  }
  return delta;
}

}  // namespace vta_torch
