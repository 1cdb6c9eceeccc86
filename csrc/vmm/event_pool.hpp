// EventPool: the driver events of one address space, created on demand and reused.
//
// Owns: every event it created (destroyed only by destroy_all(), at close) and the idle
// ones ready for reuse; the record-then-wait sequences that order work between streams or
// against the host.
// Invariants: an event is either idle or held by exactly one user (a pending free, an
// in-flight copy) until given back; a sequence that fails part-way gives its event back
// before the error propagates, so no event leaks and no state changed; an event given back
// right after a wait was issued on it may be re-recorded at once (a wait binds to the work
// recorded when it was issued, so reuse cannot loosen it).
#pragma once

#include <algorithm>
#include <vector>

#include "backend/backend.hpp"

namespace vta {

// Add `s` to the streams a sequence must order against, once.
inline void add_stream(std::vector<StreamHandle>* streams, StreamHandle s) {
  if (std::find(streams->begin(), streams->end(), s) == streams->end()) streams->push_back(s);
}

class EventPool {
 public:
  explicit EventPool(Backend& backend) : backend_(backend) {}
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  EventHandle take();
  void give(EventHandle e) { idle_.push_back(e); }

  // An event recorded on `s` (the caller gives it back); throws, holding nothing, on failure.
  EventHandle record(StreamHandle s);
  // The same for a stream with a copy queued on it: if recording fails, waits for `s` on the
  // host before throwing, so the copy cannot still run under memory the caller then reuses.
  EventHandle record_after_copy(StreamHandle s);
  // Make stream `waiter` wait for the work queued on `s` so far.
  void record_then_wait(StreamHandle s, StreamHandle waiter);
  // Wait on the host for the work queued on `s` so far.
  void record_then_sync(StreamHandle s);
  // Whether `e` completed: waits for it if `wait`, else polls.
  bool done(EventHandle e, bool wait);

  // Destroy every event (close(); whoever held one is gone).
  void destroy_all();

 private:
  // Take an event and record it on `s`; on failure it is idle again.
  Status try_record(StreamHandle s, EventHandle* out);

  Backend& backend_;
  std::vector<EventHandle> idle_;
  std::vector<EventHandle> all_;
};

}  // namespace vta
