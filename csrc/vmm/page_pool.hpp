// PagePool: physical pages created and exported for other processes, never mapped here.
//
// Owns: the pages the service leases out (one backend page handle each, addressed by a
// 64-bit id that is never reused within a pool) and a capacity limit. Exports are fresh
// file descriptors the caller owns. Thread-safe.
// Invariant: pages_held() * page_bytes() <= capacity; after close() nothing is held.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend/backend.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

class PagePool {
 public:
  static std::unique_ptr<PagePool> create(const vta_config_t& config);
  ~PagePool();

  uint64_t create_page();           // throws OutOfMemory at capacity
  int export_page(uint64_t id);     // throws InvalidArgument for an unknown id
  void release_page(uint64_t id);
  void close();
  vta_pool_info_t info();

 private:
  PagePool(std::unique_ptr<Backend> backend, size_t page_bytes, uint64_t capacity);
  void check_open_locked() const;

  std::mutex mu_;
  bool closed_ = false;
  std::unique_ptr<Backend> backend_;
  int backend_kind_;
  int device_;
  size_t page_bytes_;
  uint64_t capacity_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, PageHandle> pages_;
  bool exportable_ = true;
};

}  // namespace vta
