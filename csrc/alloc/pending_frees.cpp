// PendingFrees implementation.
//
// Owns: the per-stream queues and their overlap queries.
// Invariants: those of pending_frees.hpp.
#include "alloc/pending_frees.hpp"

namespace vta {

void PendingFrees::push(StreamHandle stream, const PendingFree& f) {
  queues_[stream].push_back(f);
  ++count_;
  bytes_ += f.size;
}

bool PendingFrees::over_page(uintptr_t va) const {
  bool pending = false;
  for (auto& [stream, queue] : queues_)
    for (const PendingFree& f : queue) pending = pending || overlaps(f, va);
  return pending;
}

void PendingFrees::add_streams_over(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const {
  if (!count_) return;
  for (auto& [stream, queue] : queues_)
    for (const PendingFree& f : queue)
      for (uintptr_t va : vas)
        if (overlaps(f, va)) add_stream(streams, stream);
}

void PendingFrees::clear() {
  queues_.clear();
  count_ = 0;
}

}  // namespace vta
