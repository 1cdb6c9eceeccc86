// SpaceExtension: what code outside an address space composes with it, and the one seam that
// installs it (the test-facing wrapper of space/testing/ is the one extension; production code
// knows only this interface).
//
// Owns: the interface, SpaceParts (the parts a space lends its extension, under its lock) and
// the process's extension factory: set once, while the library loads (space/testing/ sets it
// from a static initializer), read by every address space when it is made.
// Invariants: an extension adapts its space's backend once, at construction, with an adaptor
// holding it (above the call counter, so a call the adaptor refuses is never counted); it is
// told when its space closes, under the space's lock, after the copies in flight completed and
// before any event or page is released; it reaches the space's parts only through
// AddressSpace::with_parts (the lock held, the space open), never by keeping them. No factory:
// spaces run without an extension, and nothing else changes.
#pragma once

#include <memory>

#include "backend/backend.hpp"

namespace vta {

class AllocPolicy;
class Residency;

// What AddressSpace::with_parts hands its callee: the space's own parts, for that call only.
struct SpaceParts {
  Backend& backend;  // the whole adaptor chain, the extension's adaptor on top
  AllocPolicy& policy;
  Residency& residency;
};

class SpaceExtension {
 public:
  virtual ~SpaceExtension() = default;
  // The backend the space will use: `backend` itself or an adaptor holding it.
  virtual std::unique_ptr<Backend> adapt(std::unique_ptr<Backend> backend) = 0;
  // The space is closing (see the invariants); `backend` is the chain adapt() returned. What
  // fails here is the extension's to absorb: close() goes on.
  virtual void closing(Backend& backend) noexcept = 0;
};

using SpaceExtensionFactory = std::unique_ptr<SpaceExtension> (*)();

// Installs the factory every address space made afterwards asks for its extension; returns
// the previous one. Meant to be called once, before any space exists.
SpaceExtensionFactory set_space_extension_factory(SpaceExtensionFactory factory);
// The installed factory (null: none).
SpaceExtensionFactory space_extension_factory();

}  // namespace vta
