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

void HostStreams::complete(uint64_t id, uint64_t generation) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(id);
    if (it != events_.end() && it->second.completed < generation) it->second.completed = generation;
  }
  events_cv_.notify_all();
}

bool HostStreams::record(uint64_t id, uint64_t stream_id) {
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(id);
    if (it == events_.end()) return false;
    generation = ++it->second.generation;
    if (stream_id == 0) it->second.completed = generation;  // synchronous stream: complete now
  }
  if (stream_id == 0) {
    events_cv_.notify_all();
    return true;
  }
  return enqueue(stream_id, [this, id, generation] { complete(id, generation); });
}

bool HostStreams::query(uint64_t id, bool* done) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = events_.find(id);
  if (it == events_.end()) return false;
  *done = it->second.completed >= it->second.generation;
  return true;
}

bool HostStreams::wait_event(uint64_t id) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = events_.find(id);
  if (it == events_.end()) return false;
  uint64_t target = it->second.generation;
  events_cv_.wait(lk, [&] {
    auto e = events_.find(id);
    return e == events_.end() || e->second.completed >= target;
  });
  return true;
}

bool HostStreams::stream_wait_event(uint64_t stream_id, uint64_t id) {
  uint64_t target;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(id);
    if (it == events_.end()) return false;
    target = it->second.generation;
  }
  auto wait = [this, id, target] {
    std::unique_lock<std::mutex> lk(mu_);
    events_cv_.wait(lk, [&] {
      auto e = events_.find(id);
      return e == events_.end() || e->second.completed >= target;
    });
  };
  return enqueue(stream_id, wait);
}

}  // namespace vta
