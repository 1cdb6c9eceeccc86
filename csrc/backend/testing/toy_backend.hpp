// A toy backend kind for the registry's tests: what adding a backend takes, run end to end.
//
// Owns: register_toy_backend. The toy is the host backend under its own name and code, without
// host-located pages (so "mapped" eviction is refused on it, as on a GPU without HOST_NUMA VMM):
// the tests show a kind registered at run time is usable by name from C and Python and that
// what it can do is read from its capabilities.
// Invariants: the toy registers through register_backend like any kind (no special case in the
// registry or above it); each name registers once per process.
#pragma once

#include <string>

#include "backend/status.hpp"

namespace vta {

// Registers a toy kind named `name` (*kind: its code); the registry's refusals apply.
Status register_toy_backend(const std::string& name, int* kind);

}  // namespace vta
