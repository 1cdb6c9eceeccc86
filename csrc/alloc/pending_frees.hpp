// PendingFrees: freed allocations waiting for their stream before their memory is reused.
//
// Owns: one FIFO of frees per stream, each with the event recorded on that stream when it
// was freed, and the pending-free bytes of the stats.
// Invariants: events recorded on one stream complete in order, so a drain stops at the first
// incomplete event of each stream; a pending free's memory is reused only after its event
// completed (unless the VTA_DEBUG_BREAK_FREE_WAIT test bit says to skip the wait); while it
// is pending, the work queued before the free may still touch its pages, so its stream is
// one a mapping change under those pages must wait for (streams_over).
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "vmm/event_pool.hpp"

namespace vta {

struct PendingFree {
  uintptr_t address;
  uint64_t size;
  bool small;
  EventHandle event;
};

class PendingFrees {
 public:
  PendingFrees(EventPool& events, size_t page_bytes) : events_(events), page_bytes_(page_bytes) {}

  void push(StreamHandle stream, const PendingFree& f);
  // Release every free whose event completed (waiting for each if `wait`; not at all if
  // `skip_wait`): release(address, size, small), in each stream's order.
  template <typename F>
  void drain(bool wait, bool skip_wait, F&& release);

  uint64_t count() const { return count_; }
  uint64_t released() const { return released_; }  // frees that completed their wait, ever
  uint64_t bytes() const { return bytes_; }
  // Whether a pending free overlaps the virtual page at `va`.
  bool over_page(uintptr_t va) const;
  // Add the streams of frees pending over any of the virtual pages `vas` (each once).
  void add_streams_over(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const;
  void clear();

 private:
  bool overlaps(const PendingFree& f, uintptr_t va) const { return f.address < va + page_bytes_ && f.address + f.size > va; }

  EventPool& events_;
  size_t page_bytes_;
  std::unordered_map<StreamHandle, std::deque<PendingFree>> queues_;
  uint64_t count_ = 0;
  uint64_t released_ = 0;
  uint64_t bytes_ = 0;
};

template <typename F>
void PendingFrees::drain(bool wait, bool skip_wait, F&& release) {
  if (!count_) return;
  // An emptied queue stays: streams are few, and a free per stream would re-create it.
  for (auto& [stream, queue] : queues_) {
    while (!queue.empty()) {
      PendingFree p = queue.front();
      bool done = skip_wait || events_.done(p.event, wait);
      if (!done) break;  // later frees on this stream were recorded after it
      queue.pop_front();
      --count_;
      ++released_;
      bytes_ -= p.size;
      events_.give(p.event);
      release(p.address, p.size, p.small);
    }
  }
}

}  // namespace vta
