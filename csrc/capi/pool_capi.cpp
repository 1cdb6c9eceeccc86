// C ABI of the page pool (service side) and of leased pages (client side).
//
// Owns: the vta_pool handle. Same rules as capi.cpp: every body runs under guarded().
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "space/address_space.hpp"
#include "capi/fork_generation.hpp"
#include "capi/guard.hpp"
#include "capi/space_handle.hpp"
#include "vmm/page_pool.hpp"
#include "vtalloc/vtalloc.h"

struct vta_pool {
  std::unique_ptr<vta::PagePool> impl;
  uint64_t generation = vta::capi::fork_generation();  // see fork_generation.hpp
  bool forked() const { return generation != vta::capi::fork_generation(); }
};

namespace {
using vta::capi::guarded;
using vta::capi::need;

vta::PagePool& open_pool(vta_pool_t* pool) {
  if (!pool || !pool->impl) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null page pool handle");
  if (pool->forked()) vta::fail(VTA_ERR_CLOSED, std::string("this page pool") + vta::capi::kForkedMessage);
  return *pool->impl;
}
}  // namespace

extern "C" {

vta_status_t vta_pool_create(const vta_config_t* config, vta_pool_t** out) {
  return guarded([&] {
    need(config, "config");
    need(out, "output");
    *out = new vta_pool{vta::PagePool::create(*config)};
  });
}

vta_status_t vta_pool_close(vta_pool_t* pool) {
  return guarded([&] {
    if (pool && pool->forked()) return;  // the parent's pages: a child closes nothing
    open_pool(pool).close();
  });
}

void vta_pool_destroy(vta_pool_t* pool) {
  try {
    if (pool && pool->forked()) (void)pool->impl.release();  // leaked in the child, never torn down
    delete pool;
  } catch (...) {
  }
}

vta_status_t vta_pool_info(vta_pool_t* pool, vta_pool_info_t* out) {
  return guarded([&] {
    need(out, "output");
    *out = open_pool(pool).info();
  });
}

vta_status_t vta_pool_create_page(vta_pool_t* pool, uint64_t* out_page_id) {
  return guarded([&] {
    need(out_page_id, "output");
    *out_page_id = open_pool(pool).create_page();
  });
}

vta_status_t vta_pool_export_page(vta_pool_t* pool, uint64_t page_id, int32_t* out_fd) {
  return guarded([&] {
    need(out_fd, "output");
    *out_fd = open_pool(pool).export_page(page_id);
  });
}

vta_status_t vta_pool_release_page(vta_pool_t* pool, uint64_t page_id) {
  return guarded([&] { open_pool(pool).release_page(page_id); });
}

vta_status_t vta_space_import_page(vta_space_t* space, int32_t fd, uint64_t tag) {
  return guarded([&] { vta::capi::open_space(space).import_page(fd, tag); });
}

vta_status_t vta_space_return_pages(vta_space_t* space, uint64_t max_pages, uint64_t* out_tags, uint64_t* out_count) {
  return guarded([&] {
    need(out_count, "count output");
    if (max_pages) need(out_tags, "tags output");
    std::vector<uint64_t> tags = vta::capi::open_space(space).return_pages(max_pages);
    std::copy(tags.begin(), tags.end(), out_tags);
    *out_count = tags.size();
  });
}

}  // extern "C"
