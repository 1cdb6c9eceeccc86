// The toy backend (toy_backend.hpp): a ForwardingBackend over a host backend.
//
// Owns: ToyBackend (its kind, its name, its capabilities; host-located pages refused) and its
// factory. Invariants: every other call reaches the host backend unchanged; the factory makes a
// toy only for a code the registry gave a toy.
#include "backend/testing/toy_backend.hpp"

#include <memory>
#include <string>
#include <utility>

#include "backend/backend_registry.hpp"
#include "backend/forwarding_backend.hpp"

namespace vta {
namespace {

BackendCapabilities toy_capabilities() {
  BackendCapabilities c;
  c.export_pages = true;
  c.test_kernels = true;
  return c;
}

class ToyBackend final : public ForwardingBackend {
 public:
  ToyBackend(std::unique_ptr<Backend> host, const BackendInfo& info)
      : ForwardingBackend(std::move(host)), info_(info) {}

  int kind() const override { return info_.kind; }
  const char* name() const override { return info_.name.c_str(); }
  BackendCapabilities capabilities() const override { return toy_capabilities(); }
  Status create_page(size_t bytes, PageLocation where, PageHandle* out) override {
    if (where == PageLocation::host)
      return Status(VTA_ERR_BACKEND_UNAVAILABLE, "backend '" + info_.name + "' has no host-located pages");
    return ForwardingBackend::create_page(bytes, where, out);
  }

 private:
  const BackendInfo& info_;  // the registry's entry: immortal
};

Status make_toy_backend(const BackendOptions& options, std::unique_ptr<Backend>* out) {
  const BackendInfo* info = find_backend(options.kind);
  if (!info || info->make != make_toy_backend)
    return Status(VTA_ERR_INVALID_ARGUMENT, "backend kind " + std::to_string(options.kind) + " is not a toy");
  std::unique_ptr<Backend> host;
  if (Status s = make_host_backend(options, &host); !s.is_ok()) return s;
  *out = std::make_unique<ToyBackend>(std::move(host), *info);
  return Status::ok();
}

}  // namespace

Status register_toy_backend(const std::string& name, int* kind) {
  BackendInfo info;
  info.name = name;
  info.capabilities = toy_capabilities();
  info.make = make_toy_backend;
  return register_backend(std::move(info), kind);
}

}  // namespace vta
