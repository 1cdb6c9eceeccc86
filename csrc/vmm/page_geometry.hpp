// PageGeometry: the backend, page size and capacity a vta_config_t asks for, validated.
//
// Owns: the one place a config becomes a backend plus a page size (a multiple of the
// backend's granularity, default the granularity itself) and a capacity (a whole number of
// pages, at least one; default the backend's, at most kMaxSpaceBytes). Used by AddressSpace
// and PagePool alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

// The most bytes a capacity or a reservation may name, and the largest allocation served
// (kMaxAllocationBytes): 64 TiB, more than any device holds and half of the 47-bit user
// address space of x86-64 Linux, so that a default reservation (2 x capacity) still fits.
constexpr uint64_t kMaxSpaceBytes = 1ull << 46;

// Refuse a setting above kMaxSpaceBytes (InvalidArgument, naming the setting and the limit).
inline void check_space_bytes(const char* setting, uint64_t bytes) {
  if (bytes > kMaxSpaceBytes)
    fail(VTA_ERR_INVALID_ARGUMENT, std::string(setting) + " of " + std::to_string(bytes) +
                                       " bytes is above the limit of an address space, 2^46 bytes (64 TiB)");
}

struct PageGeometry {
  std::unique_ptr<Backend> backend;
  size_t page_bytes;
  uint64_t capacity_bytes;
};

inline PageGeometry make_page_geometry(const vta_config_t& config) {
  // Callers built before cost_model was appended pass a shorter struct: no cost model.
  if (config.struct_size < offsetof(vta_config_t, cost_model))
    fail(VTA_ERR_INVALID_ARGUMENT, "vta_config_t: struct_size too small");
  BackendOptions opts;
  if (config.struct_size >= offsetof(vta_config_t, reserved2)) opts.cost_model = static_cast<int>(config.cost_model);
  check_space_bytes("capacity", config.capacity_bytes);
  opts.kind = config.backend;
  opts.device = config.device;
  opts.host_device_bytes = config.capacity_bytes;
  opts.host_granularity_bytes = config.host_granularity_bytes;
  PageGeometry g;
  check(make_backend(opts, &g.backend));
  size_t gran = g.backend->granularity();
  g.page_bytes = config.page_bytes ? config.page_bytes : gran;
  if (g.page_bytes % gran != 0)
    fail(VTA_ERR_INVALID_ARGUMENT, "page size " + std::to_string(g.page_bytes) + " is not a multiple of the " +
                                       g.backend->name() + " granularity " + std::to_string(gran));
  uint64_t capacity = config.capacity_bytes ? config.capacity_bytes : g.backend->default_capacity();
  g.capacity_bytes = capacity / g.page_bytes * g.page_bytes;
  if (g.capacity_bytes < g.page_bytes)
    fail(VTA_ERR_INVALID_ARGUMENT, "capacity must hold at least one page of " + std::to_string(g.page_bytes) + " bytes");
  return g;
}

}  // namespace vta
