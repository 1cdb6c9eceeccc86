// StreamUses: record_stream, the streams other than its own that use a live allocation, and
// the freed blocks that wait for those streams before any reuse.
//
// Owns: per live address, the extra streams recorded on it; per freed (or kept, see
// live_allocations.hpp) block that had some, one event per extra stream recorded at its free,
// and the bytes of the freed ones (part of the stats' pending_free_bytes).
// Invariants: a block waiting here is in no free set and no pending-free queue, so nothing
// (not even an allocation on its own stream) can reuse it before every one of its events
// completed; then the freed ones go to the caller's pending-free machinery (its own stream's
// queue), the kept ones simply stop waiting. An event is never recorded on a stream that is
// capturing a CUDA graph: that stream's mark stays unrecorded (the block waits) until a later
// poll finds the capture over. Each event is held by one mark and given back when it is done.
// In blocks/: the allocation policy owns and changes these records; the eviction engine only
// reads them, through BlockFacts (block_facts.hpp), and never calls the policy.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "blocks/pending_frees.hpp"
#include "backend/backend.hpp"
#include "vmm/event_pool.hpp"

namespace vta {

class StreamUses {
 public:
  StreamUses(EventPool& events, size_t page_bytes, int backend_kind)
      : events_(events), page_bytes_(page_bytes), backend_kind_(backend_kind) {}
  StreamUses(const StreamUses&) = delete;
  StreamUses& operator=(const StreamUses&) = delete;

  // The live block at `address` (allocated on `own`) is also used on `stream`; own or twice: nothing.
  void record(uintptr_t address, StreamHandle own, StreamHandle stream);
  // The extra streams of `address`, forgotten here (at its free); empty when none.
  std::vector<StreamHandle> take(uintptr_t address);
  // Whether extra streams are recorded on the live block at `address`.
  bool has_streams(uintptr_t address) const { return recorded_.count(address) != 0; }
  // Add the extra streams recorded on the live block at `address` (none: nothing).
  void add_recorded(uintptr_t address, std::vector<StreamHandle>* streams) const;
  // Block `f` (of stream `own`) waits for the work queued so far on each of `streams`. `kept`:
  // it stays its owner's (a graph pool's) and only stops waiting when done.
  void await(const PendingFree& f, StreamHandle own, const std::vector<StreamHandle>& streams, bool kept);
  // A kept block waiting here is now freed: it goes on to the pending frees when done.
  void mark_freed(uintptr_t address);
  // Whether the block at `address` still waits (polls first).
  bool waiting(uintptr_t address);
  // Hand every freed block whose events completed (all of them, waiting, if `wait`) to
  // ready(own stream, block); returns how many.
  template <typename F>
  uint64_t poll(bool wait, F&& ready);

  uint64_t freed_count() const { return freed_count_; }
  uint64_t freed_bytes() const { return freed_bytes_; }
  bool empty() const { return waiting_.empty(); }
  bool over_page(uintptr_t va) const;
  // Add the streams (own and recorded) of blocks waiting over any of the virtual pages `vas`.
  void add_streams_over(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const;
  void clear();

 private:
  struct Mark {
    StreamHandle stream;
    EventHandle event;  // 0: not recorded yet (the stream was capturing)
  };
  struct Waiting {
    PendingFree f;
    StreamHandle own;
    bool kept;
    std::vector<Mark> marks;
  };
  // Record the marks not yet recorded, give back the completed ones; true when none is left.
  bool settle(Waiting& w, bool wait);
  bool overlaps(const PendingFree& f, uintptr_t va) const { return f.address < va + page_bytes_ && f.address + f.size > va; }

  EventPool& events_;
  size_t page_bytes_;
  int backend_kind_;
  std::unordered_map<uintptr_t, std::vector<StreamHandle>> recorded_;
  std::list<Waiting> waiting_;
  uint64_t freed_count_ = 0;
  uint64_t freed_bytes_ = 0;
};

template <typename F>
uint64_t StreamUses::poll(bool wait, F&& ready) {
  uint64_t n = 0;
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (!settle(*it, wait)) {
      ++it;
      continue;
    }
    Waiting w = *it;
    it = waiting_.erase(it);
    if (w.kept) continue;
    --freed_count_;
    freed_bytes_ -= w.f.size;
    ++n;
    ready(w.own, w.f);
  }
  return n;
}

}  // namespace vta
