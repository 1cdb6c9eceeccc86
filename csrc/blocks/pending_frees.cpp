// PendingFrees implementation.
//
// Owns: the batches of each stream, sealing them, taking from them, and the overlap queries.
// Invariants: those of pending_frees.hpp.
#include "blocks/pending_frees.hpp"

namespace vta {

void PendingFrees::push(StreamHandle stream, const PendingFree& f) {
  Queue& q = queues_[stream];
  if (q.batches.empty() || q.batches.back().event != 0) q.batches.emplace_back();
  Batch& open = q.batches.back();
  uint64_t seq = q.next_seq++;
  open.frees.push_back(Entry{f, seq});
  q.by_size.emplace(Key{f.size, seq}, std::make_pair(&open, std::prev(open.frees.end())));
  ++count_;
  bytes_ += f.size;
}

uintptr_t PendingFrees::take_from(Queue& q, std::map<Key, std::pair<Batch*, std::list<Entry>::iterator>>::iterator at,
                                  uint64_t bytes) {
  auto [batch, entry] = at->second;
  PendingFree& f = entry->f;
  uintptr_t address = f.address;
  q.by_size.erase(at);
  --count_;  // re-counted below if a rest stays
  bytes_ -= bytes;
  if (f.size == bytes) {
    batch->frees.erase(entry);
    drop_if_empty(q, batch);
  } else {
    f.address += bytes;
    f.size -= bytes;
    ++count_;
    q.by_size.emplace(Key{f.size, entry->seq}, std::make_pair(batch, entry));
  }
  return address;
}

void PendingFrees::drop_if_empty(Queue& q, Batch* b) {
  if (!b->frees.empty() || b->event == 0) return;  // the open batch stays, even empty
  events_.give(b->event);
  for (auto it = q.batches.begin(); it != q.batches.end(); ++it)
    if (&*it == b) {
      q.batches.erase(it);
      return;
    }
}

void PendingFrees::seal(StreamHandle stream, Queue& q) {
  if (q.batches.empty() || q.batches.back().event != 0 || q.batches.back().frees.empty()) return;
  bool capturing = false;
  (void)Backend::stream_is_capturing(backend_kind_, stream, &capturing);  // false when it cannot be asked
  if (capturing) return;
  q.batches.back().event = events_.record(stream);  // throws, having changed nothing
}

void PendingFrees::seal_all() {
  for (auto& [stream, q] : queues_) seal(stream, q);
}

void PendingFrees::seal_stream(StreamHandle stream) {
  auto it = queues_.find(stream);
  if (it != queues_.end()) seal(stream, it->second);
}

bool PendingFrees::over_page(uintptr_t va) const {
  for (auto& [stream, q] : queues_)
    for (auto& [key, where] : q.by_size)
      if (overlaps(where.second->f, va)) return true;
  return false;
}

void PendingFrees::add_streams_over(const std::vector<uintptr_t>& vas, std::vector<StreamHandle>* streams) const {
  if (!count_) return;
  for (auto& [stream, q] : queues_)
    for (auto& [key, where] : q.by_size)
      for (uintptr_t va : vas)
        if (overlaps(where.second->f, va)) add_stream(streams, stream);
}

void PendingFrees::clear() {
  queues_.clear();
  count_ = 0;
  bytes_ = 0;
}

}  // namespace vta
