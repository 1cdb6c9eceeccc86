// EventPool implementation.
//
// Owns: the driver calls on events (create, record, wait, query, destroy).
// Invariants: those of event_pool.hpp.
#include "vmm/event_pool.hpp"

namespace vta {

EventHandle EventPool::take() {
  if (!idle_.empty()) {
    EventHandle e = idle_.back();
    idle_.pop_back();
    return e;
  }
  EventHandle e = 0;
  check(backend_.event_create(&e));
  all_.push_back(e);
  return e;
}

Status EventPool::try_record(StreamHandle s, EventHandle* out) {
  *out = take();
  Status st = backend_.event_record(*out, s);
  if (!st.is_ok()) give(*out);
  return st;
}

EventHandle EventPool::record(StreamHandle s) {
  EventHandle e = 0;
  check(try_record(s, &e));
  return e;
}

EventHandle EventPool::record_after_copy(StreamHandle s) {
  EventHandle e = 0;
  Status st = try_record(s, &e);
  if (!st.is_ok()) {
    (void)backend_.stream_synchronize(s);
    check(st);
  }
  return e;
}

void EventPool::record_then_wait(StreamHandle s, StreamHandle waiter) {
  EventHandle e = take();
  Status st = backend_.event_record(e, s);
  if (st.is_ok()) st = backend_.stream_wait_event(waiter, e);
  give(e);
  check(st);
}

void EventPool::record_then_sync(StreamHandle s) {
  EventHandle e = take();
  Status st = backend_.event_record(e, s);
  if (st.is_ok()) st = backend_.event_synchronize(e);
  give(e);
  check(st);
}

bool EventPool::done(EventHandle e, bool wait) {
  if (wait) {
    check(backend_.event_synchronize(e));
    return true;
  }
  bool complete = false;
  check(backend_.event_query(e, &complete));
  return complete;
}

void EventPool::destroy_all() {
  for (EventHandle e : all_) (void)backend_.event_destroy(e);
  all_.clear();
  idle_.clear();
}

}  // namespace vta
