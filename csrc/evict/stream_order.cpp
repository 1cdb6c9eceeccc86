// StreamOrder: the copy stream and the ordering of the engine's copies and mapping changes
// (see stream_order.hpp).
//
// Owns: nothing beyond stream_order.hpp's.
// Invariants: those of stream_order.hpp; the waits for one copy are queued before the copy, in
// the order BlockFacts names the streams.
#include "evict/stream_order.hpp"

#include <algorithm>

namespace vta {

StreamHandle StreamOrder::stream() {
  if (!made_) {
    check(backend_.stream_create(&stream_));
    made_ = true;
  }
  return stream_;
}

void StreamOrder::copy_slots(uintptr_t va, const HostPool::Slots& slots, const std::vector<ByteRange>& live,
                             bool to_host, StreamHandle stream) {
  uint64_t at = 0;  // the handle's offset of this slot's first byte
  for (const HostPool::Slot& s : slots) {
    uint64_t n = uint64_t{s.npages} * page_bytes_;
    auto copy = [&](uint64_t lo, uint64_t hi) {  // handle offsets inside this slot
      uintptr_t host = s.addr + (lo - at), dev = va + lo;
      check(to_host ? backend_.copy(host, dev, hi - lo, stream) : backend_.copy(dev, host, hi - lo, stream));
    };
    if (live.empty()) {
      copy(at, at + n);
    } else {
      for (const ByteRange& r : live) {
        uint64_t lo = std::max(r.offset, at), hi = std::min(r.offset + r.bytes, at + n);
        if (lo < hi) copy(lo, hi);
      }
    }
    at += n;
  }
}

EventHandle StreamOrder::copy_out(uintptr_t va, uint64_t bytes, const HostPool::Slots& slots,
                                  const std::vector<ByteRange>& live) {
  StreamHandle cs = stream();
  // Order the copy after the last use: an event on every stream of the handle's allocations
  // (their own and those recorded on them with record_stream).
  std::vector<StreamHandle> streams;
  if (!broken(VTA_DEBUG_BREAK_COPY_ORDER)) facts_.add_live_streams(va, bytes, &streams);
  for (StreamHandle s : streams) events_.record_then_wait(s, cs);
  copy_slots(va, slots, live, /*to_host=*/true, cs);
  // The copy is queued; if no event records its end, wait for it so the slot is not reused under it.
  return events_.record_after_copy(cs);
}

EventHandle StreamOrder::copy_in(uintptr_t dst, const HostPool::Slots& slots, const std::vector<ByteRange>& live) {
  StreamHandle cs = stream();
  copy_slots(dst, slots, live, /*to_host=*/false, cs);
  return events_.record_after_copy(cs);
}

void StreamOrder::copy_runs(const std::vector<CopyRuns::Run>& runs, bool to_host,
                            const std::vector<std::pair<uintptr_t, uint64_t>>& after) {
  StreamHandle cs = stream();
  if (to_host && !broken(VTA_DEBUG_BREAK_COPY_ORDER)) {
    std::vector<StreamHandle> streams;
    for (auto [va, bytes] : after) facts_.add_live_streams(va, bytes, &streams);
    for (StreamHandle s : streams) events_.record_then_wait(s, cs);
  }
  for (const CopyRuns::Run& r : runs) {
    Status s = to_host ? backend_.copy(r.host, r.va, r.bytes, cs) : backend_.copy(r.va, r.host, r.bytes, cs);
    if (!s.is_ok()) {
      (void)backend_.stream_synchronize(cs);  // the copies queued before it end before their memory is reused
      check(s);
    }
  }
}

Status StreamOrder::consumer_after(StreamHandle consumer, EventHandle copy) {
  if (consumer == stream_) return Status::ok();  // the copy stream runs in order
  return backend_.stream_wait_event(consumer, copy);
}

void StreamOrder::quiesce(const std::vector<Span>& spans) {
  if (broken(VTA_DEBUG_BREAK_QUIESCE)) return;
  std::vector<StreamHandle> streams;
  std::vector<uintptr_t> pages;  // every virtual page of these away pages
  for (const Span& s : spans) {
    for (uint32_t k = 0; k < s.npages; ++k) pages.push_back(s.va + k * page_bytes_);
    facts_.add_live_streams(s.va, uint64_t{s.npages} * page_bytes_, &streams);
    if (s.consumers)
      for (StreamHandle c : *s.consumers) add_stream(&streams, c);
  }
  // A freed block's work may still run until its free completes (pending, or after record_stream).
  facts_.add_freed_streams(pages, &streams);
  for (StreamHandle s : streams) events_.record_then_sync(s);
}

Status StreamOrder::synchronize() {
  return made_ ? backend_.stream_synchronize(stream_) : Status::ok();
}

Status StreamOrder::destroy() {
  if (!made_) return Status::ok();
  Status s = backend_.stream_destroy(stream_);
  made_ = false;
  return s;
}

}  // namespace vta
