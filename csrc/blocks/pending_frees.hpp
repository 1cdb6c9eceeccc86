// PendingFrees: freed allocations waiting for their stream before other streams may reuse them.
//
// Owns: per stream, the frees made on it in order, in batches: the open batch (frees with no
// event recorded after them yet) and sealed batches, each closed by one event recorded on the
// stream after its frees; a best-fit index of every free by size; the pending-free bytes of
// the stats.
//
// Stream-ordered reuse: work queued on one stream runs in order, so a block freed on stream S
// may be given to the next allocation on S at once (take()), with no event: anything the new
// owner queues on S runs after the freed block's last use on S (what PyTorch's caching
// allocator and cudaMallocAsync rely on). An event is needed only when the memory is to go
// anywhere else (another stream, a cached handle to be remapped, the eviction engine): then
// seal() records one on S, covering every open free of S at once; an event recorded later on
// S still completes after the freed blocks' last use on S.
//
// Invariants: a free is released (to the free sets, for any stream) only after the event of
// its batch completed, unless the VTA_DEBUG_BREAK_FREE_WAIT test bit says to skip the wait;
// events recorded on one stream complete in order, so a drain stops at the first incomplete
// batch of each stream, and the open batch (no event) is always the last; take() hands a free
// only to an allocation on the stream it was freed on; while a free is pending, the work queued
// before it may still touch its pages, so its stream is one a mapping change under those pages
// must wait for (add_streams_over); a stream that is capturing a CUDA graph is never sealed
// (its event would become part of the graph): its frees stay pending until it ends capture.
// In blocks/: the allocation policy owns and changes these records; the eviction engine only
// reads them, through BlockFacts (block_facts.hpp), and never calls the policy.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <utility>
#include <unordered_map>
#include <vector>

#include "backend/backend.hpp"
#include "vmm/event_pool.hpp"

namespace vta {

struct PendingFree {
  uintptr_t address;
  uint64_t size;
};

class PendingFrees {
 public:
  PendingFrees(EventPool& events, size_t page_bytes, int backend_kind)
      : events_(events), page_bytes_(page_bytes), backend_kind_(backend_kind) {}
  PendingFrees(const PendingFrees&) = delete;
  PendingFrees& operator=(const PendingFrees&) = delete;

  // A free on `stream` joins its open batch (no driver call).
  void push(StreamHandle stream, const PendingFree& f);
  // Stream-ordered reuse: the smallest pending free of `stream` with at least `bytes` and at most
  // `most` for which usable(address, bytes) holds, split if larger (the rest stays pending in
  // its batch); false when none. No driver call.
  template <typename Usable>
  bool take(StreamHandle stream, uint64_t bytes, uint64_t most, Usable&& usable, uintptr_t* out);
  // Record one event on every stream with open frees (one, for seal_stream), closing its batch.
  void seal_all();
  void seal_stream(StreamHandle stream);
  // Release every free whose batch's event completed (waiting for each if `wait`; not at all,
  // open batches included, if `skip_wait`): release(address, size), in each stream's
  // order; returns how many. Seal first for a wait to cover the open frees.
  template <typename F>
  uint64_t drain(bool wait, bool skip_wait, F&& release);

  uint64_t count() const { return count_; }
  uint64_t released() const { return released_; }  // frees that completed their wait, ever
  uint64_t bytes() const { return bytes_; }
  // Whether a pending free overlaps the virtual page at `va`.
  bool over_page(uintptr_t va) const;
  // Add the streams of frees pending over any of the virtual pages `vas` (each once).
  void add_streams_over(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const;
  void clear();

 private:
  struct Batch;
  struct Entry {
    PendingFree f;
    uint64_t seq;  // the index key's tie-breaker
  };
  struct Batch {
    EventHandle event = 0;  // recorded on the stream after its frees; 0: the open batch
    std::list<Entry> frees;
  };
  using Key = std::pair<uint64_t, uint64_t>;  // (size, seq)
  struct Queue {
    std::list<Batch> batches;  // oldest first; only the last may be open
    std::map<Key, std::pair<Batch*, std::list<Entry>::iterator>> by_size;
    uint64_t next_seq = 0;
  };

  bool overlaps(const PendingFree& f, uintptr_t va) const { return f.address < va + page_bytes_ && f.address + f.size > va; }
  void seal(StreamHandle stream, Queue& q);
  // Take `bytes` from the front of the entry `at` indexes (all of it, or split).
  uintptr_t take_from(Queue& q, std::map<Key, std::pair<Batch*, std::list<Entry>::iterator>>::iterator at,
                      uint64_t bytes);
  // Give back the event of a sealed batch that has no free left (nothing waits on it).
  void drop_if_empty(Queue& q, Batch* b);

  EventPool& events_;
  size_t page_bytes_;
  int backend_kind_;
  std::unordered_map<StreamHandle, Queue> queues_;
  uint64_t count_ = 0;
  uint64_t released_ = 0;
  uint64_t bytes_ = 0;
};

template <typename Usable>
bool PendingFrees::take(StreamHandle stream, uint64_t bytes, uint64_t most, Usable&& usable, uintptr_t* out) {
  auto qit = queues_.find(stream);
  if (qit == queues_.end() || qit->second.by_size.empty()) return false;
  Queue& q = qit->second;
  // A few candidates at most: one is unusable only when a page under it is away, or when the
  // request would use too little of an extent under it (rare).
  int tries = 4;
  for (auto it = q.by_size.lower_bound(Key{bytes, 0}); it != q.by_size.end() && tries-- > 0; ++it) {
    if (it->first.first > most) break;
    if (!usable(it->second.second->f.address, bytes)) continue;
    *out = take_from(q, it, bytes);
    return true;
  }
  return false;
}

template <typename F>
uint64_t PendingFrees::drain(bool wait, bool skip_wait, F&& release) {
  if (!count_) return 0;
  uint64_t n = 0;
  // An emptied queue stays: streams are few, and a free per stream would re-create it.
  for (auto& [stream, q] : queues_) {
    while (!q.batches.empty()) {
      Batch& b = q.batches.front();
      if (!skip_wait && (b.event == 0 || !events_.done(b.event, wait))) break;  // later batches come after it
      while (!b.frees.empty()) {  // one at a time: a release that throws leaves the rest pending
        PendingFree f = b.frees.front().f;
        q.by_size.erase(Key{f.size, b.frees.front().seq});
        b.frees.pop_front();
        --count_;
        ++released_;
        ++n;
        bytes_ -= f.size;
        release(f.address, f.size);
      }
      if (b.event) events_.give(b.event);
      q.batches.pop_front();
    }
  }
  return n;
}

}  // namespace vta
