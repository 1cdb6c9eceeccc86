// PrivatePools: PyTorch's graph-private memory pools (CUDA graphs, MemPool) over the torch
// shim's per-device spaces.
//
// Owns: per device and pool id, the pool's use count and its blocks (address -> size, request,
// stream, live or cached), and the lookup from a block's address to its pool.
// Invariants: a block belongs to one pool for life; a cached block is kept by its space
// (AddressSpace::keep: out of every free set, its pages never evictable) and handed only to an
// allocation in the same pool on the same stream, of at least half its size (best fit); when
// the pool's last user leaves, its cached blocks go back to the space at once and its live ones
// at their free; a pool with neither users nor blocks is forgotten. One mutex guards all of it
// and is taken before a space's own (never the other way round).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "space/address_space.hpp"
#include "vtalloc/torch_native.h"

namespace vta::capi {

class PrivatePools {
 public:
  struct Block {
    uint64_t size;  // rounded
    uint64_t requested;
    StreamHandle stream;
    bool live;
  };
  using Id = std::pair<uint64_t, uint64_t>;

  static bool is_pool(const vta_torch_pool_id_t* id) { return id && (id->first || id->second); }

  void incref(int device, Id id);
  void release(int device, Id id, AddressSpace* space);
  int32_t use_count(int device, Id id);
  uint64_t empty(int device, Id id);
  // Allocate in the pool (which must have users): a cached block of the pool on `stream`, or
  // a new one from the space.
  // A new block carries region tag `region` (a kept block taken back keeps the one it was made with).
  uintptr_t malloc(int device, Id id, AddressSpace& space, uint64_t size, StreamHandle stream, uint32_t region = 0);
  // Free the block at `address` if a pool owns it (true); false: not a pool's block.
  bool free(int device, uintptr_t address, AddressSpace& space);
  // The pool with users that owns the block at `address`, if any (residency refuses those).
  bool in_used_pool(int device, uintptr_t address);
  // Cached blocks of `device` (held by its space as kept) and the bytes of every pool's blocks.
  uint64_t cached_count(int device);
  uint64_t reserved_bytes(int device);
  // The pool of a block (and the block), or false.
  bool owner(int device, uintptr_t address, Id* id, Block* block);
  // Every block of `device` (of one pool if `only`), with its pool.
  void for_each_block(int device, const Id* only, const std::function<void(uintptr_t, const Block&, Id)>& f);
  // setCheckpointPoolState (torch_native.h): all or nothing.
  void set_live(int device, Id id, AddressSpace& space, const std::vector<uint64_t>& live,
                std::vector<uint64_t>* freed, std::vector<uint64_t>* allocated);
  // Forget every pool (vta_torch_release: no space is left).
  void clear();

 private:
  struct Pool {
    int32_t users = 0;
    std::map<uintptr_t, Block> blocks;
  };
  using Key = std::pair<int, Id>;
  Pool& existing_locked(int device, Id id);
  void forget_if_done_locked(int device, Id id);

  std::mutex mu_;
  std::map<Key, Pool> pools_;
  std::map<std::pair<int, uintptr_t>, Id> owners_;  // (device, block address) -> its pool
};

}  // namespace vta::capi
