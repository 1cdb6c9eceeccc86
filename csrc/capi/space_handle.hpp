// The vta_space handle shared by the C ABI translation units.
//
// Owns: the definition of `struct vta_space` and open_space(), which refuses a null handle
// and reports a closed one, or one made before a fork() (fork_generation.hpp), as VTA_ERR_CLOSED.
#pragma once

#include <memory>
#include <string>

#include "capi/fork_generation.hpp"
#include "space/address_space.hpp"
#include "backend/status.hpp"
#include "vtalloc/vtalloc.h"

struct vta_space {
  std::unique_ptr<vta::AddressSpace> impl;
  uint64_t generation = vta::capi::fork_generation();  // the process (fork generation) it belongs to
  bool forked() const { return generation != vta::capi::fork_generation(); }
};

namespace vta::capi {

inline vta::AddressSpace& open_space(vta_space_t* space) {
  if (!space) vta::fail(VTA_ERR_INVALID_ARGUMENT, "null address space handle");
  if (space->forked()) vta::fail(VTA_ERR_CLOSED, std::string("this address space") + kForkedMessage);
  if (!space->impl) vta::fail(VTA_ERR_CLOSED, "the address space is closed");
  return *space->impl;
}

}  // namespace vta::capi
