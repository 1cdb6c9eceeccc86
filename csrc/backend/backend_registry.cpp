// The backend registry (backend_registry.hpp) and the choice of a backend by code.
//
// Owns: the list of built-in kinds (VTA_BUILT_IN_BACKENDS), the registry's storage, the "auto"
// rule (the first usable kind of device memory, else the first usable other one, each in
// registration order), the dispatch of the questions asked without a backend object
// (stream_is_capturing), the process-wide counters every backend reports into, and the hand-off
// to the cost model (host backend only; the wrapping itself is make_cost_model_backend,
// backend/testing/cost_model.cpp).
// Invariants: entries are written under the registry's mutex and published by a release store of
// the count; readers load the count (acquire) and read only entries below it, without a lock.
#include "backend/backend_registry.hpp"

#include <atomic>
#include <mutex>

#include "backend/counters.hpp"

// The built-in backends, in code order: host = VTA_BACKEND_HOST (1), cuda = VTA_BACKEND_CUDA (2).
// A new backend: its file defines `BackendInfo <name>_backend_info()`; add its name at the end.
#define VTA_BUILT_IN_BACKENDS(X) X(host) X(cuda)

namespace vta {

#define VTA_DECLARE_BACKEND_INFO(name) BackendInfo name##_backend_info();
VTA_BUILT_IN_BACKENDS(VTA_DECLARE_BACKEND_INFO)
#undef VTA_DECLARE_BACKEND_INFO

GlobalCounters& global_counters() {
  static GlobalCounters counters;
  return counters;
}

namespace {

struct Registry {
  std::mutex mu;  // writers: add()
  std::atomic<size_t> count{0};
  BackendInfo entries[kMaxBackends];

  Status add(BackendInfo info, int* kind) {
    if (info.name.empty() || info.name.size() > kMaxBackendName || info.name == "auto")
      return Status(VTA_ERR_INVALID_ARGUMENT, "a backend needs a name of 1 to " + std::to_string(kMaxBackendName) +
                                                  " characters other than 'auto'");
    if (!info.make) return Status(VTA_ERR_INVALID_ARGUMENT, "backend '" + info.name + "' has no factory");
    if (info.capabilities.needs_context && !(info.save_context && info.restore_context))
      return Status(VTA_ERR_INVALID_ARGUMENT, "backend '" + info.name + "' needs a context but cannot save one");
    if (!info.relax_capture_mode != !info.restore_capture_mode)
      return Status(VTA_ERR_INVALID_ARGUMENT, "backend '" + info.name + "' can relax the capture mode but not restore it");
    if (info.capabilities.can_capture && !info.stream_is_capturing)
      return Status(VTA_ERR_INVALID_ARGUMENT, "backend '" + info.name + "' can capture but cannot be asked whether it does");
    std::lock_guard<std::mutex> lk(mu);
    size_t n = count.load(std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i)
      if (entries[i].name == info.name)
        return Status(VTA_ERR_INVALID_ARGUMENT, "a backend named '" + info.name + "' is registered already");
    if (n == kMaxBackends)
      return Status(VTA_ERR_INVALID_ARGUMENT, "the backend registry is full (" + std::to_string(kMaxBackends) + ")");
    info.kind = static_cast<int>(n) + 1;
    entries[n] = std::move(info);
    if (kind) *kind = entries[n].kind;
    count.store(n + 1, std::memory_order_release);
    return Status::ok();
  }
};

Registry& registry() {
  static Registry* r = [] {
    auto* made = new Registry();  // immortal: entries are handed out as pointers for the process's life
#define VTA_REGISTER_BUILT_IN(name) (void)made->add(name##_backend_info(), nullptr);
    VTA_BUILT_IN_BACKENDS(VTA_REGISTER_BUILT_IN)
#undef VTA_REGISTER_BUILT_IN
    return made;
  }();
  return *r;
}

}  // namespace

size_t backend_count() { return registry().count.load(std::memory_order_acquire); }

const BackendInfo* backend_at(size_t i) { return i < backend_count() ? &registry().entries[i] : nullptr; }

const BackendInfo* find_backend(int kind) {
  return kind >= 1 ? backend_at(static_cast<size_t>(kind) - 1) : nullptr;
}

const BackendInfo* find_backend(const std::string& name) {
  for (size_t i = 0, n = backend_count(); i < n; ++i)
    if (registry().entries[i].name == name) return &registry().entries[i];
  return nullptr;
}

const BackendInfo* first_device_memory_backend() {
  for (size_t i = 0, n = backend_count(); i < n; ++i)
    if (registry().entries[i].capabilities.device_memory) return &registry().entries[i];
  return nullptr;
}

Status register_backend(BackendInfo info, int* kind) { return registry().add(std::move(info), kind); }

namespace {
Status make_backend_of_kind(const BackendOptions& options, std::unique_ptr<Backend>* out) {
  if (options.kind != VTA_BACKEND_AUTO) {
    const BackendInfo* b = find_backend(options.kind);
    if (!b) return Status(VTA_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(options.kind));
    return b->make(options, out);
  }
  // auto: device memory first, then the others; only "unavailable" moves on to the next.
  Status last(VTA_ERR_BACKEND_UNAVAILABLE, "no backend is registered");
  for (bool device_memory : {true, false}) {
    for (size_t i = 0, n = backend_count(); i < n; ++i) {
      const BackendInfo& b = registry().entries[i];
      if (b.capabilities.device_memory != device_memory) continue;
      BackendOptions mine = options;
      mine.kind = b.kind;
      last = b.make(mine, out);
      if (last.is_ok() || last.code() != VTA_ERR_BACKEND_UNAVAILABLE) return last;
    }
  }
  return last;
}
}  // namespace

Status make_backend(const BackendOptions& options, std::unique_ptr<Backend>* out) {
  if (options.cost_model == VTA_COST_MODEL_NONE) return make_backend_of_kind(options, out);
  return make_cost_model_backend(options, out);  // backend/testing/cost_model.cpp
}

Status Backend::stream_is_capturing(int kind, StreamHandle stream, bool* capturing) {
  *capturing = false;
  const BackendInfo* b = find_backend(kind);
  if (!b) return Status(VTA_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(kind));
  if (!b->stream_is_capturing) return Status::ok();  // its streams never capture
  return b->stream_is_capturing(stream, capturing);
}

}  // namespace vta
