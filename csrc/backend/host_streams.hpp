// Asynchronous streams and events for the host backend, so that ordering bugs show on a CPU.
//
// Owns: one worker thread per created stream that runs queued copies in order, and events
// that complete when the worker reaches the point where they were recorded. Stream 0 is
// synchronous (work runs on the caller's thread), like PyTorch's CPU ops.
// Invariants: work on one stream runs in the order it was queued; an event is complete iff
// every task queued on its stream before its last record() has run; a wait (on the host or
// on a stream) waits for the record that was the event's last when the wait was issued, as
// cuStreamWaitEvent does: recording the event again, even on another stream, changes nothing
// for waits already issued; destroying a stream drains it first.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace vta {

class HostStreams {
 public:
  HostStreams() = default;
  ~HostStreams() { shutdown(); }
  // Drain and join every stream's worker (idempotent).
  void shutdown();
  HostStreams(const HostStreams&) = delete;
  HostStreams& operator=(const HostStreams&) = delete;

  uint64_t create_stream();
  bool destroy_stream(uint64_t stream);
  // Run `task` in order on `stream` (stream 0: now, on this thread). False for an unknown stream.
  bool enqueue(uint64_t stream, std::function<void()> task);
  bool synchronize(uint64_t stream);
  // Wait until every stream's queue is empty (those created while it waits included: it
  // looks again until a pass finds each idle).
  void synchronize_all();
  // Stream 0, or one created and not yet destroyed.
  bool known(uint64_t stream) { return stream == 0 || this->stream(stream) != nullptr; }

  uint64_t create_event();
  bool destroy_event(uint64_t event);
  bool record(uint64_t event, uint64_t stream);
  bool query(uint64_t event, bool* complete);
  bool wait_event(uint64_t event);                  // block the caller
  bool stream_wait_event(uint64_t stream, uint64_t event);  // order `stream` after `event`

 private:
  struct Stream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    bool busy = false;
    bool stop = false;
    std::thread worker;
  };
  // One record() of an event: done when its stream reached the point of the record.
  struct Record {
    bool done = false;  // guarded by mu_
  };
  struct Event {
    std::shared_ptr<Record> last;  // the latest record; none: never recorded (complete)
  };

  std::shared_ptr<Stream> stream(uint64_t id);
  void complete(const std::shared_ptr<Record>& record);
  void wait_for(const std::shared_ptr<Record>& record);
  static void run(Stream* s);

  std::mutex mu_;                // guards the two tables and every Event
  std::condition_variable events_cv_;
  std::unordered_map<uint64_t, std::shared_ptr<Stream>> streams_;
  std::unordered_map<uint64_t, Event> events_;
  uint64_t next_id_ = 0;
};

}  // namespace vta
