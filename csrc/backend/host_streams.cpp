// HostStreams implementation; see host_streams.hpp.
#include "backend/host_streams.hpp"

namespace vta {

void HostStreams::shutdown() {
  std::unordered_map<uint64_t, std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lk(mu_);
    streams.swap(streams_);
  }
  for (auto& [id, s] : streams) {
    {
      std::lock_guard<std::mutex> lk(s->mu);
      s->stop = true;
    }
    s->cv.notify_all();
    if (s->worker.joinable()) s->worker.join();
  }
}

void HostStreams::run(Stream* s) {
  std::unique_lock<std::mutex> lk(s->mu);
  for (;;) {
    s->cv.wait(lk, [&] { return s->stop || !s->queue.empty(); });
    if (s->queue.empty()) return;  // stop requested and drained
    auto task = std::move(s->queue.front());
    s->queue.pop_front();
    s->busy = true;
    lk.unlock();
    task();
    lk.lock();
    s->busy = false;
    s->cv.notify_all();
  }
}

uint64_t HostStreams::create_stream() {
  auto s = std::make_shared<Stream>();
  s->worker = std::thread(run, s.get());
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t id = ++next_id_;
  streams_[id] = s;
  return id;
}

bool HostStreams::destroy_stream(uint64_t id) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return false;
    s = it->second;
    streams_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lk(s->mu);
    s->stop = true;
  }
  s->cv.notify_all();
  s->worker.join();
  return true;
}

std::shared_ptr<HostStreams::Stream> HostStreams::stream(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second;
}

bool HostStreams::enqueue(uint64_t id, std::function<void()> task) {
  if (id == 0) {
    task();
    return true;
  }
  auto s = stream(id);
  if (!s) return false;
  {
    std::lock_guard<std::mutex> lk(s->mu);
    s->queue.push_back(std::move(task));
  }
  s->cv.notify_all();
  return true;
}

bool HostStreams::synchronize(uint64_t id) {
  if (id == 0) return true;
  auto s = stream(id);
  if (!s) return false;
  std::unique_lock<std::mutex> lk(s->mu);
  s->cv.wait(lk, [&] { return s->queue.empty() && !s->busy; });
  return true;
}

void HostStreams::synchronize_all() {
  for (;;) {
    std::vector<std::shared_ptr<Stream>> all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [id, s] : streams_) all.push_back(s);
    }
    bool idle = true;
    for (auto& s : all) {
      std::unique_lock<std::mutex> lk(s->mu);
      if (!s->queue.empty() || s->busy) idle = false;
      s->cv.wait(lk, [&] { return s->queue.empty() && !s->busy; });
    }
    if (idle) return;  // a pass that waited for nothing: every stream was idle at once
  }
}

uint64_t HostStreams::create_event() {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t id = ++next_id_;
  events_[id] = Event{};
  return id;
}

bool HostStreams::destroy_event(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  return events_.erase(id) == 1;
}

void HostStreams::complete(const std::shared_ptr<Record>& record) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    record->done = true;
  }
  events_cv_.notify_all();
}

void HostStreams::wait_for(const std::shared_ptr<Record>& record) {
  if (!record) return;
  std::unique_lock<std::mutex> lk(mu_);
  events_cv_.wait(lk, [&] { return record->done; });
}

bool HostStreams::record(uint64_t id, uint64_t stream_id) {
  auto record = std::make_shared<Record>();
  std::shared_ptr<Stream> s;
  if (stream_id != 0) {
    s = stream(stream_id);
    if (!s) return false;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(id);
    if (it == events_.end()) return false;
    it->second.last = record;
    if (stream_id == 0) record->done = true;  // synchronous stream: complete now
  }
  if (stream_id == 0) {
    events_cv_.notify_all();
    return true;
  }
  if (enqueue(stream_id, [this, record] { complete(record); })) return true;
  complete(record);  // the stream was destroyed meanwhile, and destroying drained it
  return false;
}

bool HostStreams::query(uint64_t id, bool* done) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = events_.find(id);
  if (it == events_.end()) return false;
  *done = !it->second.last || it->second.last->done;
  return true;
}

bool HostStreams::wait_event(uint64_t id) {
  std::shared_ptr<Record> record;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(id);
    if (it == events_.end()) return false;
    record = it->second.last;
  }
  wait_for(record);
  return true;
}

bool HostStreams::stream_wait_event(uint64_t stream_id, uint64_t id) {
  std::shared_ptr<Record> record;  // the record this wait is for, whatever is recorded later
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(id);
    if (it == events_.end()) return false;
    record = it->second.last;
  }
  return enqueue(stream_id, [this, record] { wait_for(record); });
}

}  // namespace vta
