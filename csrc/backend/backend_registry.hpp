// The backend registry: every backend kind the process knows, by name and by code, with its
// factory, its capabilities and the questions asked of it without a backend object.
//
// Owns: BackendInfo (one kind's entry) and the lookups over the registry. The built-in kinds are
// one list in backend_registry.cpp (VTA_BUILT_IN_BACKENDS): a new backend is its own file, which
// defines `BackendInfo <name>_backend_info()`, plus one word in that list. register_backend adds
// one at run time (tests: backend/testing/toy_backend.cpp).
// Invariants: an entry, once published, never changes nor moves (the registry is immortal), so a
// `const BackendInfo*` stays valid for the life of the process and lookups take no lock; codes
// are 1, 2, ... in registration order, the built-ins first (host = VTA_BACKEND_HOST = 1, cuda =
// VTA_BACKEND_CUDA = 2: the public header's stable values); 0 is "auto", never an entry; names
// are unique.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backend/backend.hpp"

namespace vta {

using BackendFactory = Status (*)(const BackendOptions& options, std::unique_ptr<Backend>* out);

struct BackendInfo {
  int kind = 0;          // its code (what vta_config_t.backend takes); set by the registry
  std::string name;      // what users type: "host", "cuda"
  BackendCapabilities capabilities;  // what any backend of this kind may do
  BackendFactory make = nullptr;
  // Whether the caller's `stream` is capturing a graph (Backend::stream_is_capturing); null when
  // the kind's streams never capture.
  Status (*stream_is_capturing)(StreamHandle stream, bool* capturing) = nullptr;
  // The calling thread's current context, saved (false: nothing saved, nothing to restore) and
  // restored where it changed (ContextGuard); null when the kind needs no context.
  bool (*save_context)(void** saved) = nullptr;
  void (*restore_context)(void* saved) = nullptr;
  // The calling thread's stream-capture mode made relaxed (driver calls that a capture in the
  // global mode forbids, such as mapping, allowed while a graph-private pool serves a capture),
  // the previous mode saved (false: nothing changed), and set back; null when the kind has none.
  bool (*relax_capture_mode)(int* previous) = nullptr;
  void (*restore_capture_mode)(int previous) = nullptr;
};

constexpr size_t kMaxBackends = 16;
constexpr size_t kMaxBackendName = 31;

// The number of registered kinds, and the i-th (registration order; null past the end).
size_t backend_count();
const BackendInfo* backend_at(size_t i);
// The entry of a code or a name; null when none.
const BackendInfo* find_backend(int kind);
const BackendInfo* find_backend(const std::string& name);
// The first registered kind of device memory (what torch's "auto" means); null when none.
const BackendInfo* first_device_memory_backend();
// Adds `info` under the next code (*kind, when not null). Refused (VTA_ERR_INVALID_ARGUMENT):
// an empty or too long name, a name taken, no factory, needs_context without both context hooks,
// can_capture without a capture query, a full registry.
Status register_backend(BackendInfo info, int* kind);

}  // namespace vta
