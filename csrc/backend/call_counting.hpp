// CallCountingBackend: an adaptor over any backend that counts the driver calls made through it.
//
// Owns: one counter per kind of call (DriverCall) that costs driver time: page create and
// release, map, unmap, set access, copy, event record/query/synchronize, stream wait and
// synchronize, reserve and free of virtual space. Every address space puts one directly over
// its backend (under its extension's adaptor, the test fault injector: space/testing/), so
// every call of the space passes it: the page table's, the eviction engine's, the host pool's,
// the event pool's.
// Invariants: a call is counted once when it is made, whatever it returns (a failed call cost
// the driver too); a call refused by the fault injector above never reaches it and is not
// counted. Counters only grow. Thread-safe (relaxed atomics: counts, not synchronization).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "backend/forwarding_backend.hpp"

namespace vta {

enum class DriverCall : int {
  create_page, release_page, map, unmap, set_access, copy, event_record, event_query, event_synchronize,
  stream_wait_event, stream_synchronize, device_synchronize, reserve, free_va, count
};

class CallCountingBackend final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  uint64_t calls(DriverCall c) const { return calls_[static_cast<int>(c)].load(std::memory_order_relaxed); }

  Status reserve(size_t b, size_t a, uintptr_t* va) override { return count(DriverCall::reserve), inner_->reserve(b, a, va); }
  Status free_va(uintptr_t va, size_t b) override { return count(DriverCall::free_va), inner_->free_va(va, b); }
  Status create_page(size_t b, PageLocation w, PageHandle* out) override {
    return count(DriverCall::create_page), inner_->create_page(b, w, out);
  }
  Status release_page(PageHandle p) override { return count(DriverCall::release_page), inner_->release_page(p); }
  Status map(uintptr_t va, size_t b, PageHandle p) override { return count(DriverCall::map), inner_->map(va, b, p); }
  Status unmap(uintptr_t va, size_t b) override { return count(DriverCall::unmap), inner_->unmap(va, b); }
  Status set_access(uintptr_t va, size_t b) override { return count(DriverCall::set_access), inner_->set_access(va, b); }
  Status copy(uintptr_t d, uintptr_t s, size_t b, StreamHandle st) override {
    return count(DriverCall::copy), inner_->copy(d, s, b, st);
  }
  Status stream_synchronize(StreamHandle s) override {
    return count(DriverCall::stream_synchronize), inner_->stream_synchronize(s);
  }
  Status device_synchronize() override {
    return count(DriverCall::device_synchronize), inner_->device_synchronize();
  }
  Status event_record(EventHandle e, StreamHandle s) override {
    return count(DriverCall::event_record), inner_->event_record(e, s);
  }
  Status event_query(EventHandle e, bool* c) override { return count(DriverCall::event_query), inner_->event_query(e, c); }
  Status event_synchronize(EventHandle e) override {
    return count(DriverCall::event_synchronize), inner_->event_synchronize(e);
  }
  Status stream_wait_event(StreamHandle s, EventHandle e) override {
    return count(DriverCall::stream_wait_event), inner_->stream_wait_event(s, e);
  }

 private:
  void count(DriverCall c) { calls_[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed); }

  std::atomic<uint64_t> calls_[static_cast<int>(DriverCall::count)] = {};
};

}  // namespace vta
