// StreamUses implementation.
//
// Owns: recording and polling the events of blocks used on several streams.
// Invariants: those of stream_uses.hpp; a failure to record an event leaves the mark
// unrecorded (the block keeps waiting, and the next poll tries again) rather than losing it.
#include "blocks/stream_uses.hpp"

#include <algorithm>

namespace vta {

void StreamUses::record(uintptr_t address, StreamHandle own, StreamHandle stream) {
  if (stream == own) return;
  std::vector<StreamHandle>& streams = recorded_[address];
  add_stream(&streams, stream);
}

void StreamUses::add_recorded(uintptr_t address, std::vector<StreamHandle>* streams) const {
  auto it = recorded_.find(address);
  if (it == recorded_.end()) return;
  for (StreamHandle s : it->second) add_stream(streams, s);
}

std::vector<StreamHandle> StreamUses::take(uintptr_t address) {
  auto it = recorded_.find(address);
  if (it == recorded_.end()) return {};
  std::vector<StreamHandle> streams = std::move(it->second);
  recorded_.erase(it);
  return streams;
}

void StreamUses::await(const PendingFree& f, StreamHandle own, const std::vector<StreamHandle>& streams, bool kept) {
  Waiting w{f, own, kept, {}};
  for (StreamHandle s : streams) w.marks.push_back(Mark{s, 0});
  waiting_.push_back(std::move(w));
  if (!kept) {
    ++freed_count_;
    freed_bytes_ += f.size;
  }
  try {
    settle(waiting_.back(), false);  // records the events now: the work queued so far
  } catch (...) {
    // Left unrecorded: the next poll records them (later, which is still after the last use).
  }
}

void StreamUses::mark_freed(uintptr_t address) {
  for (Waiting& w : waiting_)
    if (w.f.address == address && w.kept) {
      w.kept = false;
      ++freed_count_;
      freed_bytes_ += w.f.size;
      return;
    }
}

bool StreamUses::waiting(uintptr_t address) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->f.address != address) continue;
    if (!settle(*it, false)) return true;
    if (it->kept) {
      waiting_.erase(it);
      return false;
    }
    return true;  // freed: poll() hands it on
  }
  return false;
}

bool StreamUses::settle(Waiting& w, bool wait) {
  for (auto it = w.marks.begin(); it != w.marks.end();) {
    if (it->event == 0) {
      bool capturing = false;
      (void)Backend::stream_is_capturing(backend_kind_, it->stream, &capturing);
      if (capturing) {
        ++it;
        continue;  // its event would become part of the graph: after the capture
      }
      it->event = events_.record(it->stream);
    }
    if (!events_.done(it->event, wait)) {
      ++it;
      continue;
    }
    events_.give(it->event);
    it = w.marks.erase(it);
  }
  return w.marks.empty();
}

bool StreamUses::over_page(uintptr_t va) const {
  return std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return overlaps(w.f, va); });
}

void StreamUses::add_streams_over(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const {
  for (const Waiting& w : waiting_)
    for (uintptr_t va : vas)
      if (overlaps(w.f, va)) {
        add_stream(streams, w.own);
        for (const Mark& m : w.marks) add_stream(streams, m.stream);
      }
}

void StreamUses::clear() {
  recorded_.clear();
  waiting_.clear();
  freed_count_ = 0;
  freed_bytes_ = 0;
}

}  // namespace vta
