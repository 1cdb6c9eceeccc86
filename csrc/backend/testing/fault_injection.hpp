// FaultInjectingBackend: a decorator over any backend that fails chosen operations on demand.
//
// Owns: per-operation counters of failures still to inject. The test extension of every address
// space (space/testing/testing_space.hpp) puts one over the space's backend, above its call
// counter (a disarmed injector only forwards), so tests can prove that a failure at
// any step of eviction or restore rolls back and loses no byte; a skip count lets a calls of
// an operation pass before the failures, so a test can fail its Nth call (every call site of
// a public operation in turn: benchmarks/soak.py). Thread-safe (under concurrent calls, which
// call is the Nth is whichever reaches the counter Nth).
#pragma once

#include <atomic>
#include <memory>

#include <string>

#include "backend/forwarding_backend.hpp"

namespace vta {

enum class FaultOp : int { copy = 0, map = 1, create_page = 2, set_access = 3, count = 4 };

class FaultInjectingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void inject(FaultOp op, int times, int skip = 0) {
    skips_[static_cast<int>(op)].store(skip);
    faults_[static_cast<int>(op)].store(times);
  }

  Status create_page(size_t b, PageLocation w, PageHandle* out) override {
    if (fire(FaultOp::create_page)) return injected("create_page");
    return inner_->create_page(b, w, out);
  }
  Status map(uintptr_t va, size_t b, PageHandle p) override {
    if (fire(FaultOp::map)) return injected("map");
    return inner_->map(va, b, p);
  }
  Status set_access(uintptr_t va, size_t b) override {
    if (fire(FaultOp::set_access)) return injected("set_access");
    return inner_->set_access(va, b);
  }
  Status copy(uintptr_t d, uintptr_t s, size_t b, StreamHandle st) override {
    if (fire(FaultOp::copy)) return injected("copy");
    return inner_->copy(d, s, b, st);
  }

 private:
  bool fire(FaultOp op) {
    auto& n = faults_[static_cast<int>(op)];
    int left = n.load();
    if (left <= 0) return false;  // disarmed: the common case, one load
    auto& s = skips_[static_cast<int>(op)];
    for (int skip = s.load(); skip > 0;)
      if (s.compare_exchange_weak(skip, skip - 1)) return false;
    while (left > 0)
      if (n.compare_exchange_weak(left, left - 1)) return true;
    return false;
  }
  static Status injected(const char* op) {
    return Status(VTA_ERR_DRIVER, std::string("injected failure of ") + op + " (test fault injection)");
  }

  std::atomic<int> faults_[static_cast<int>(FaultOp::count)] = {};
  std::atomic<int> skips_[static_cast<int>(FaultOp::count)] = {};
};

}  // namespace vta
