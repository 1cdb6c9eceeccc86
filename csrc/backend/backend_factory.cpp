// Backend selection: which implementation of the driver seam an address space gets.
//
// Owns: the "auto" rule (cuda when a CUDA device is usable, else host), the dispatch by kind
// of the questions asked without a backend object (stream_is_capturing), the process-wide
// counters every backend reports into, and the hand-off to the cost model (host backend only;
// the wrapping itself is make_cost_model_backend, backend/testing/cost_model.cpp).
#include "backend/backend.hpp"
#include "backend/counters.hpp"

namespace vta {

GlobalCounters& global_counters() {
  static GlobalCounters counters;
  return counters;
}

namespace {
Status make_backend_of_kind(const BackendOptions& options, std::unique_ptr<Backend>* out) {
  switch (options.kind) {
    case VTA_BACKEND_HOST:
      return make_host_backend(options, out);
    case VTA_BACKEND_CUDA:
      return make_cuda_backend(options, out);
    case VTA_BACKEND_AUTO: {
      Status s = make_cuda_backend(options, out);
      if (s.is_ok()) return s;
      if (s.code() != VTA_ERR_BACKEND_UNAVAILABLE) return s;
      return make_host_backend(options, out);
    }
    default:
      return Status(VTA_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(options.kind));
  }
}
}  // namespace

Status make_backend(const BackendOptions& options, std::unique_ptr<Backend>* out) {
  if (options.cost_model == VTA_COST_MODEL_NONE) return make_backend_of_kind(options, out);
  return make_cost_model_backend(options, out);  // backend/testing/cost_model.cpp
}

Status Backend::stream_is_capturing(int kind, StreamHandle stream, bool* capturing) {
  *capturing = false;
  switch (kind) {
    case VTA_BACKEND_HOST:
      return Status::ok();  // host streams never capture
    case VTA_BACKEND_CUDA:
      return cuda_stream_is_capturing(stream, capturing);
    default:
      return Status(VTA_ERR_INVALID_ARGUMENT, "unknown backend kind " + std::to_string(kind));
  }
}

}  // namespace vta
