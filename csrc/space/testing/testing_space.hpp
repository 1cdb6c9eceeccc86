// TestingSpace: the test-facing wrapper of an AddressSpace, and TestExtension, the state it
// keeps in the space (the space's extension: space/space_extension.hpp).
//
// Owns: TestExtension, installed as the space extension of every address space while the
// library loads (as every space carried a fault injector before the hooks left AddressSpace):
// the FaultInjectingBackend it puts over the space's backend (backend/testing/fault_injection.hpp)
// and the streams tests created on the space (user streams, for test kernels:
// backend/testing/host_kernels.hpp). TestingSpace holds an AddressSpace& and reaches the rest
// through it: fault injection, broken ordering rules, user streams, test kernels and their
// counters, the victim policy's counters (csrc/space/testing/testing_space.cpp).
// Invariants: the user streams are read and changed only under the space's lock (inside
// AddressSpace::with_parts, or closing()); a space closing destroys them, after their work,
// before any page is released; every hook but inject_fault's injection itself runs under the
// space's lock on an open space (VTA_ERR_CLOSED otherwise); a space made with no extension
// (none installed) refuses every hook with VTA_ERR_BACKEND_UNAVAILABLE. Nothing outside a
// testing/ directory includes this header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/testing/fault_injection.hpp"
#include "space/address_space.hpp"
#include "space/space_extension.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

class TestExtension final : public SpaceExtension {
 public:
  std::unique_ptr<Backend> adapt(std::unique_ptr<Backend> backend) override;
  void closing(Backend& backend) noexcept override;

 private:
  friend class TestingSpace;
  FaultInjectingBackend* faults_ = nullptr;  // adapt()'s adaptor, owned by the space's chain
  std::vector<StreamHandle> streams_;        // created by TestingSpace::create_stream; under the space's lock
};

class TestingSpace {
 public:
  // VTA_ERR_BACKEND_UNAVAILABLE when `space` carries no TestExtension.
  explicit TestingSpace(AddressSpace& space);

  // Let `skip` calls of backend operation `op` (FaultOp) pass, then fail the next `times`.
  void inject_fault(int op, int times, int skip = 0);
  // Deliberately break ordering rules (VTA_DEBUG_BREAK_* bits; 0: none), to show that the
  // stress tests catch it.
  void break_ordering(uint32_t mask);
  // Streams of the space's own, and test kernels on them (host backend only).
  StreamHandle create_stream();
  void destroy_stream(StreamHandle stream);
  void synchronize_stream(StreamHandle stream);
  void run_test_kernel(StreamHandle stream, uintptr_t address, uint64_t nbytes, int kind, uint64_t seed,
                       uint64_t duration_ns);
  vta_kernel_counters_t kernel_counters();
  // The victim policy's candidate pages now and the entries its calls touched so far (what a
  // free costs in the LRU).
  void victim_counters(uint64_t* candidate_pages, uint64_t* entries_touched);

 private:
  AddressSpace& space_;
  TestExtension& ext_;
};

}  // namespace vta
