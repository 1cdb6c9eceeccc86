// vta_history.hpp's implementation: the bounded per-device trace and the live allocations' stacks.
//
// Owns: nothing beyond History's members and the process's one History (never destroyed: torch
// frees tensors during its own static destruction, after ours would have run).
// Invariants: see vta_history.hpp; an action named in skip_actions is never recorded; a block
// outside a graph pool is a segment of its own (segment_alloc before its alloc, segment_free after
// its free), as snapshot() reports it.
#include "torch_binding/vta_history.hpp"

#include "torch_binding/vta_allocator.hpp"  // TORCH_BINDING_VERSION

#include <chrono>
#include <utility>

namespace vta_torch {

namespace {

using Action = cca::TraceEntry::Action;

// torch's action names (TraceEntry's), for skip_actions; an unknown name is ignored.
bool parse_action(const std::string& name, Action* out) {
  static const std::pair<const char*, Action> table[] = {
      {"alloc", Action::ALLOC}, {"free_requested", Action::FREE_REQUESTED},
      {"free_completed", Action::FREE_COMPLETED}, {"segment_alloc", Action::SEGMENT_ALLOC},
      {"segment_free", Action::SEGMENT_FREE}, {"segment_map", Action::SEGMENT_MAP},
      {"segment_unmap", Action::SEGMENT_UNMAP}, {"snapshot", Action::SNAPSHOT}, {"oom", Action::OOM}};
  for (const auto& [n, action] : table) {
    if (name == n) {
      *out = action;
      return true;
    }
  }
  return false;
}

cca::TraceEntry entry(Action action, c10::DeviceIndex device, size_t addr, size_t size, void* stream,
                      c10::MempoolId_t pool, std::shared_ptr<c10::GatheredContext> context, std::string metadata) {
  cca::TraceEntry e(action, device, addr, size, stream, pool, 0, std::move(context), "", std::move(metadata));
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  e.time_.t_ = static_cast<time_t>(std::chrono::duration_cast<std::chrono::microseconds>(now).count());
  return e;
}

}  // namespace

History& history() {
  static History* h = new History();  // leaked on purpose, see above
  return *h;
}

void History::configure(bool enabled, cca::CreateContextFn recorder, size_t max_entries, cca::RecordContext when,
                        bool clear, const std::vector<std::string>& skip_actions) {
  std::lock_guard<std::mutex> lock(mutex_);
  recorder_ = recorder;
  when_ = recorder != nullptr ? when : cca::RecordContext::NEVER;
  max_entries_ = max_entries;
  skip_.clear();
  for (const auto& name : skip_actions) {
    Action action;
    if (parse_action(name, &action)) skip_.push_back(action);
  }
  if (clear || !enabled) {
    traces_.clear();
    if (!enabled) live_.clear();
  }
  for (auto& trace : traces_) {
    while (trace.size() > max_entries_) trace.pop_front();
  }
  enabled_.store(enabled, std::memory_order_release);
}

std::shared_ptr<c10::GatheredContext> History::gather(bool wanted) {
  cca::CreateContextFn recorder = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recorder = wanted ? recorder_ : nullptr;
  }
  return recorder != nullptr ? recorder() : nullptr;
}

bool History::skipped(Action action) const {
  for (Action a : skip_) {
    if (a == action) return true;
  }
  return false;
}

void History::push(cca::TraceEntry e) {
  if (max_entries_ == 0 || skipped(e.action_)) return;
  const size_t device = static_cast<size_t>(e.device_ < 0 ? 0 : e.device_);
  if (traces_.size() <= device) traces_.resize(device + 1);
  auto& trace = traces_[device];
  if (trace.size() >= max_entries_) trace.pop_front();
  trace.push_back(std::move(e));
}

void History::on_alloc(c10::DeviceIndex device, void* ptr, size_t size, void* stream, c10::MempoolId_t pool) {
  if (!enabled()) return;
  cca::RecordContext when;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    when = when_;
  }
  // STATE keeps the stack for the live allocation only; ALLOC and ALL put it on the trace too.
  auto context = gather(when != cca::RecordContext::NEVER);
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t address = reinterpret_cast<uintptr_t>(ptr);
  live_[address] = Live{device, size, stream, pool, context};
  const bool traced = when_ == cca::RecordContext::ALLOC || when_ == cca::RecordContext::ALL;
  // snapshot() reports each block outside a graph pool as a segment of its own (a pool's freed
  // blocks stay in it as cached segments): the trace says so, so that memory_viz's allocator-state
  // view finds every block it replays inside a segment.
  if (pool.first == 0 && pool.second == 0) {
    push(entry(Action::SEGMENT_ALLOC, device, address, size, stream, pool, nullptr, user_metadata_));
  }
  push(entry(Action::ALLOC, device, address, size, stream, pool, traced ? context : nullptr, user_metadata_));
}

void History::on_free(c10::DeviceIndex device, void* ptr, size_t size) {
  if (!enabled()) return;
  bool with_stack;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    with_stack = when_ == cca::RecordContext::ALL;
  }
  auto context = gather(with_stack);
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t address = reinterpret_cast<uintptr_t>(ptr);
  void* stream = nullptr;
  c10::MempoolId_t pool{0, 0};
  auto it = live_.find(address);
  if (it != live_.end()) {  // allocated while recording: what was recorded then
    device = it->second.device;
    size = it->second.size;
    stream = it->second.stream;
    pool = it->second.pool;
    live_.erase(it);
  }
  // vtalloc hands a freed block back at once (reuse by another stream waits for an event on the
  // block's stream, inside vtalloc): the free is requested and completed in one step.
  push(entry(Action::FREE_REQUESTED, device, address, size, stream, pool, context, user_metadata_));
  push(entry(Action::FREE_COMPLETED, device, address, size, stream, pool, context, user_metadata_));
  if (pool.first == 0 && pool.second == 0) {
    push(entry(Action::SEGMENT_FREE, device, address, size, stream, pool, nullptr, user_metadata_));
  }
}

void History::on_oom(c10::DeviceIndex device, size_t requested, size_t device_free, void* stream) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  push(entry(Action::OOM, device, device_free, requested, stream, c10::MempoolId_t{0, 0}, nullptr, user_metadata_));
}

void History::on_annotate(uint64_t address, const std::string& metadata) {
#if TORCH_BINDING_VERSION >= 214
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(address);
  if (it == live_.end()) return;  // torch annotates live allocations only; one made before recording has no entry
  push(entry(Action::ANNOTATE, it->second.device, address, it->second.size, it->second.stream, it->second.pool,
             nullptr, metadata));
#else
  (void)address;
  (void)metadata;
#endif
}

std::vector<cca::TraceEntry> History::trace(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t d = static_cast<size_t>(device < 0 ? 0 : device);
  if (d >= traces_.size()) return {};
  return std::vector<cca::TraceEntry>(traces_[d].begin(), traces_[d].end());
}

std::shared_ptr<c10::GatheredContext> History::context_of(uint64_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(address);
  return it != live_.end() ? it->second.context : nullptr;
}

void History::set_user_metadata(const std::string& metadata) {
  std::lock_guard<std::mutex> lock(mutex_);
  user_metadata_ = metadata;
}

std::string History::user_metadata() {
  std::lock_guard<std::mutex> lock(mutex_);
  return user_metadata_;
}

}  // namespace vta_torch
