// The vta_space handle shared by the C ABI translation units.
//
// Owns: the definition of `struct vta_space` and open_space(), which refuses a null handle
// and reports a closed one as VTA_ERR_CLOSED.
#pragma once

#include <memory>

#include "space/address_space.hpp"
#include "backend/status.hpp"
#include "vtalloc/vtalloc.h"

struct vta_space {
  std::unique_ptr<vta::AddressSpace> impl;
};

namespace vta::capi {

inline vta::AddressSpace& open_space(vta_space_t* space) {
  if (!space) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null address space handle");
  if (!space->impl) vta::fail(VTA_ERR_CLOSED, "the address space is closed");
  return *space->impl;
}

}  // namespace vta::capi
