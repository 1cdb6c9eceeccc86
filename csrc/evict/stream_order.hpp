// StreamOrder: the eviction engine's copy stream, and every wait that orders the engine's work
// against the streams that may touch a page (invariant 4, docs/eviction.md "Ordering").
//
// Owns: the copy stream (created on first use, destroyed by destroy()); the copies between an
// away page and its host slots, which run on it; the events that order them: an eviction's
// copy after events recorded on every stream of the page's allocations, a restore's consumer
// after the copy, and the host wait before a mapping change (quiesce); and the test bits that
// break those rules on purpose (VTA_DEBUG_BREAK_QUIESCE, VTA_DEBUG_BREAK_COPY_ORDER). What it
// must know of the streams over a page it reads from BlockFacts (data the policy keeps current).
// Invariants: a copy is queued only after the waits that order it are queued; every copy's
// end is recorded by an event, or waited for on the host when the record fails, so a slot is
// never reused under a running copy; quiesce() returns only when work queued so far on every
// stream that may touch the pages completed. Every call is made under the address space's lock.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "blocks/block_facts.hpp"
#include "evict/copy_runs.hpp"
#include "evict/host_pool.hpp"
#include "vmm/event_pool.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {

class StreamOrder {
 public:
  StreamOrder(Backend& backend, EventPool& events, const BlockFacts& facts, size_t page_bytes)
      : backend_(backend), events_(events), facts_(facts), page_bytes_(page_bytes) {}
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // The copy stream, created on the first call (throws when it cannot be).
  StreamHandle stream();
  // An eviction's copy of [va, va + bytes) into `slots`, queued after the last use of those
  // pages: an event recorded now on every stream of their allocations. Only the `live` ranges
  // are copied (empty: all), one copy per range and slot they meet. The event that completes it.
  EventHandle copy_out(uintptr_t va, uint64_t bytes, const HostPool::Slots& slots, const std::vector<ByteRange>& live);
  // A restore's copy of the same ranges from `slots` into [dst, ...); the event that completes it.
  EventHandle copy_in(uintptr_t dst, const HostPool::Slots& slots, const std::vector<ByteRange>& live);
  // A batch's copies (copy runs, copy_runs.hpp), one per run, queued on the copy stream: to the
  // host after the last use of the pages `after` names (an event recorded now on every stream of
  // their allocations, each stream once), or back from it (`to_host` false; `after` unused). The
  // caller waits for them (synchronize); on a refused copy, those queued are waited for first.
  void copy_runs(const std::vector<CopyRuns::Run>& runs, bool to_host,
                 const std::vector<std::pair<uintptr_t, uint64_t>>& after);
  // `consumer` waits (on the device) for the copy `copy` completes; nothing when it is the copy
  // stream itself.
  Status consumer_after(StreamHandle consumer, EventHandle copy);
  // Whether the copy `copy` completes has completed (waiting for it if `wait`); give() hands
  // the event back once it has.
  bool done(EventHandle copy, bool wait) { return events_.done(copy, wait); }
  void give(EventHandle copy) { events_.give(copy); }

  // The virtual pages of one away page, and its restore's consumer streams (or null).
  struct Span {
    uintptr_t va;
    uint32_t npages;
    const std::vector<StreamHandle>* consumers;
  };
  // Wait on the host until no work queued so far may touch these pages: events recorded now,
  // then waited for, on the streams of their allocations (recorded streams included), of the
  // frees pending on them and of their restores' consumers.
  void quiesce(const std::vector<Span>& spans);

  // Test support: VTA_DEBUG_BREAK_QUIESCE / VTA_DEBUG_BREAK_COPY_ORDER bits.
  void set_debug_break(uint32_t mask) { debug_break_ = mask; }
  bool broken(uint32_t bit) const { return (debug_break_ & bit) != 0; }

  // close(): wait for everything queued on the copy stream; wait for one copy; destroy the
  // stream. Each returns its error, and does nothing when the stream was never made.
  Status synchronize();
  Status wait(EventHandle copy) { return backend_.event_synchronize(copy); }
  Status destroy();
  // The copy stream, or 0 when it was never made (comparisons only).
  StreamHandle handle() const { return stream_; }

 private:
  // Queue copies between the pages at `va` and `slots`, one per slot.
  void copy_slots(uintptr_t va, const HostPool::Slots& slots, const std::vector<ByteRange>& live, bool to_host,
                  StreamHandle stream);

  Backend& backend_;
  EventPool& events_;
  const BlockFacts& facts_;
  size_t page_bytes_;
  StreamHandle stream_ = 0;
  bool made_ = false;
  uint32_t debug_break_ = 0;  // VTA_DEBUG_BREAK_* bits (tests only)
};

}  // namespace vta
