// ForwardingBackend: the base of backend adaptors, forwarding every call to a wrapped backend.
//
// Owns: the wrapped backend. Each adaptor (FaultInjectingBackend, CallCountingBackend,
// CostModelBackend) overrides only the calls it changes.
// Invariants: every operation not overridden reaches the wrapped backend unchanged.
#pragma once

#include <memory>
#include <utility>

#include "backend/backend.hpp"

namespace vta {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  Backend& inner() { return *inner_; }

  int kind() const override { return inner_->kind(); }
  const char* name() const override { return inner_->name(); }
  int device() const override { return inner_->device(); }
  size_t granularity() const override { return inner_->granularity(); }
  uint64_t default_capacity() const override { return inner_->default_capacity(); }
  BackendCapabilities capabilities() const override { return inner_->capabilities(); }
  Status reserve(size_t b, size_t a, uintptr_t* va) override { return inner_->reserve(b, a, va); }
  Status free_va(uintptr_t va, size_t b) override { return inner_->free_va(va, b); }
  Status create_page(size_t b, PageLocation w, PageHandle* out) override { return inner_->create_page(b, w, out); }
  Status release_page(PageHandle p) override { return inner_->release_page(p); }
  Status map(uintptr_t va, size_t b, PageHandle p) override { return inner_->map(va, b, p); }
  Status unmap(uintptr_t va, size_t b) override { return inner_->unmap(va, b); }
  Status set_access(uintptr_t va, size_t b) override { return inner_->set_access(va, b); }
  Status copy(uintptr_t d, uintptr_t s, size_t b, StreamHandle st) override { return inner_->copy(d, s, b, st); }
  Status stream_create(StreamHandle* out) override { return inner_->stream_create(out); }
  Status stream_destroy(StreamHandle s) override { return inner_->stream_destroy(s); }
  Status stream_synchronize(StreamHandle s) override { return inner_->stream_synchronize(s); }
  Status device_synchronize() override { return inner_->device_synchronize(); }
  Status event_create(EventHandle* out) override { return inner_->event_create(out); }
  Status event_destroy(EventHandle e) override { return inner_->event_destroy(e); }
  Status event_record(EventHandle e, StreamHandle s) override { return inner_->event_record(e, s); }
  Status event_query(EventHandle e, bool* c) override { return inner_->event_query(e, c); }
  Status event_synchronize(EventHandle e) override { return inner_->event_synchronize(e); }
  Status stream_wait_event(StreamHandle s, EventHandle e) override { return inner_->stream_wait_event(s, e); }
  Status check_stream(StreamHandle s) override { return inner_->check_stream(s); }
  Status host_alloc_pinned(size_t b, void** out) override { return inner_->host_alloc_pinned(b, out); }
  Status host_free_pinned(void* p, size_t b) override { return inner_->host_free_pinned(p, b); }
  Status export_page(PageHandle p, int* fd) override { return inner_->export_page(p, fd); }
  Status import_page(int fd, size_t b, PageHandle* out) override { return inner_->import_page(fd, b, out); }
  Status launch_test_kernel(StreamHandle s, uintptr_t va, size_t b, int kind, uint64_t seed, uint64_t ns) override {
    return inner_->launch_test_kernel(s, va, b, kind, seed, ns);
  }
  Status test_kernel_counters(vta_kernel_counters_t* out) override { return inner_->test_kernel_counters(out); }

 protected:
  std::unique_ptr<Backend> inner_;
};

}  // namespace vta
