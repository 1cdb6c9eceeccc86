// PrivatePools (private_pools.hpp): use counts, routing and reuse of graph-private pools.
//
// Owns: the lifecycle steps of a pool and the order of its space calls.
// Invariants: those of private_pools.hpp; every space call that can fail comes before the
// pool's own records change, so a failure leaves both as they were.
#include "torch/private_pools.hpp"

#include <algorithm>
#include <string>

#include "blocks/text.hpp"

namespace vta::capi {
namespace {

std::string name(PrivatePools::Id id) {
  return "(" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

}  // namespace

PrivatePools::Pool& PrivatePools::existing_locked(int device, Id id) {
  auto it = pools_.find(Key{device, id});
  if (it == pools_.end())
    fail(VTA_ERR_INVALID_ARGUMENT, "no graph-private pool " + name(id) + " on device " + std::to_string(device));
  return it->second;
}

void PrivatePools::forget_if_done_locked(int device, Id id) {
  auto it = pools_.find(Key{device, id});
  if (it != pools_.end() && it->second.users == 0 && it->second.blocks.empty()) pools_.erase(it);
}

void PrivatePools::incref(int device, Id id) {
  if (!id.first && !id.second) fail(VTA_ERR_INVALID_ARGUMENT, "pool id (0, 0) means no pool");
  std::lock_guard<std::mutex> lk(mu_);
  pools_[Key{device, id}].users++;
}

void PrivatePools::release(int device, Id id, AddressSpace* space) {
  std::lock_guard<std::mutex> lk(mu_);
  Pool& pool = existing_locked(device, id);
  if (pool.users == 0) fail(VTA_ERR_INVALID_ARGUMENT, "graph-private pool " + name(id) + " has no users to release");
  if (--pool.users == 0) {
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      if (it->second.live) {
        ++it;
        continue;
      }
      space->release_kept(it->first);  // back to the space's pending frees
      owners_.erase({device, it->first});
      it = pool.blocks.erase(it);
    }
  }
  forget_if_done_locked(device, id);
}

int32_t PrivatePools::use_count(int device, Id id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = pools_.find(Key{device, id});
  return it == pools_.end() ? 0 : it->second.users;
}

uint64_t PrivatePools::empty(int device, Id id) {
  std::lock_guard<std::mutex> lk(mu_);
  (void)existing_locked(device, id);
  // A pool without users holds no cached block (they left at its last release); with users, a
  // live graph may still replay into them: nothing to give back either way.
  return 0;
}

uintptr_t PrivatePools::malloc(int device, Id id, AddressSpace& space, uint64_t size, StreamHandle stream,
                               uint32_t region) {
  std::lock_guard<std::mutex> lk(mu_);
  Pool& pool = existing_locked(device, id);
  if (pool.users == 0)
    fail(VTA_ERR_INVALID_ARGUMENT, "graph-private pool " + name(id) + " has no users: allocate in it between "
                                                                       "vta_torch_pool_incref and its release");
  uint64_t rounded = space.rounded_size(size);
  // Best fit among the pool's cached blocks of this stream, never more than twice the request.
  std::vector<std::pair<uint64_t, uintptr_t>> fits;
  for (auto& [address, b] : pool.blocks)
    if (!b.live && b.stream == stream && b.size >= rounded && b.size <= 2 * rounded) fits.emplace_back(b.size, address);
  std::sort(fits.begin(), fits.end());
  for (auto& [bytes, address] : fits) {
    if (!space.unkeep(address, size)) continue;  // still waiting for a recorded stream
    Block& b = pool.blocks[address];
    b.live = true;
    b.requested = size;
    return address;
  }
  uintptr_t address = space.malloc(size, stream, true, true, region);
  pool.blocks[address] = Block{rounded, size, stream, true};
  owners_[{device, address}] = id;
  return address;
}

bool PrivatePools::free(int device, uintptr_t address, AddressSpace& space) {
  std::lock_guard<std::mutex> lk(mu_);
  auto o = owners_.find({device, address});
  if (o == owners_.end()) return false;
  Id id = o->second;
  Pool& pool = existing_locked(device, id);
  Block& b = pool.blocks.at(address);
  if (!b.live) fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(address) + " was already freed (its block is cached by graph-private pool " + name(id) + ")");
  if (pool.users > 0) {
    space.keep(address);
    b.live = false;
    return true;
  }
  space.free(address);
  pool.blocks.erase(address);
  owners_.erase(o);
  forget_if_done_locked(device, id);
  return true;
}

bool PrivatePools::in_used_pool(int device, uintptr_t address) {
  std::lock_guard<std::mutex> lk(mu_);
  auto o = owners_.find({device, address});
  if (o == owners_.end()) return false;
  auto it = pools_.find(Key{device, o->second});
  return it != pools_.end() && it->second.users > 0;
}

uint64_t PrivatePools::cached_count(int device) {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t n = 0;
  for (auto& [key, pool] : pools_)
    if (key.first == device)
      for (auto& [address, b] : pool.blocks) n += b.live ? 0 : 1;
  return n;
}

uint64_t PrivatePools::reserved_bytes(int device) {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t n = 0;
  for (auto& [key, pool] : pools_)
    if (key.first == device)
      for (auto& [address, b] : pool.blocks) n += b.size;
  return n;
}

bool PrivatePools::owner(int device, uintptr_t address, Id* id, Block* block) {
  std::lock_guard<std::mutex> lk(mu_);
  auto o = owners_.find({device, address});
  if (o == owners_.end()) return false;
  *id = o->second;
  *block = pools_.at(Key{device, o->second}).blocks.at(address);
  return true;
}

void PrivatePools::for_each_block(int device, const Id* only,
                                  const std::function<void(uintptr_t, const Block&, Id)>& f) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [key, pool] : pools_)
    if (key.first == device && (!only || key.second == *only))
      for (auto& [address, b] : pool.blocks) f(address, b, key.second);
}

void PrivatePools::set_live(int device, Id id, AddressSpace& space, const std::vector<uint64_t>& live,
                            std::vector<uint64_t>* freed, std::vector<uint64_t>* allocated) {
  std::lock_guard<std::mutex> lk(mu_);
  Pool& pool = existing_locked(device, id);
  std::vector<uint64_t> wanted(live);
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  for (uint64_t a : wanted)
    if (!pool.blocks.count(a))
      fail(VTA_ERR_INVALID_ARGUMENT, "address " + hex(a) + " is not a block of graph-private pool " + name(id));
  freed->clear();
  allocated->clear();
  for (auto& [address, b] : pool.blocks) {
    bool want = std::binary_search(wanted.begin(), wanted.end(), address);
    if (want && !b.live) allocated->push_back(address);
    if (!want && b.live) freed->push_back(address);
  }
  // Cached blocks become live first: the one step that can refuse (a recorded stream still
  // runs); undone if a later one does.
  std::vector<uint64_t> done;
  for (uint64_t a : *allocated) {
    if (!space.unkeep(a, pool.blocks.at(a).requested)) {
      for (uint64_t back : done) space.keep(back);
      freed->clear();
      allocated->clear();
      fail(VTA_ERR_INVALID_ARGUMENT, "block " + hex(a) + " of graph-private pool " + name(id) +
                                         " still waits for a stream it was recorded on");
    }
    done.push_back(a);
  }
  for (uint64_t a : *allocated) pool.blocks.at(a).live = true;
  for (uint64_t a : *freed) {
    if (pool.users > 0) {
      space.keep(a);
      pool.blocks.at(a).live = false;
      continue;
    }
    space.free(a);  // no user left to keep it for
    pool.blocks.erase(a);
    owners_.erase({device, a});
  }
  forget_if_done_locked(device, id);
}

void PrivatePools::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  pools_.clear();
  owners_.clear();
}

}  // namespace vta::capi
