// The torch-native binding's allocation history: what torch.cuda.memory._record_memory_history()
// asks the allocator to keep, for _snapshot() / _dump_snapshot() and PyTorch's memory_viz.
//
// Owns: per device a bounded ring of trace entries (alloc, free_requested, free_completed, oom,
// annotate, and segment_alloc / segment_free for the one-block segments snapshot() reports)
// with the stack torch's context recorder gathered, and, while recording, the context of every
// live allocation made since (the snapshot's blocks show where each was allocated).
// Invariants:
//  - Costs one atomic load per allocation and free while not recording.
//  - torch's context recorder (it may take the GIL) is never called under this object's lock,
//    so a thread holding the GIL and waiting on the lock cannot deadlock with one gathering.
//  - The ring holds at most the max_entries recordHistory gave (torch's alloc_trace_max_entries);
//    the oldest entries go first, as in torch's own allocator.
//  - Times are microseconds since the epoch, as torch's snapshot reports them (time_us).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace vta_torch {

namespace cca = c10::cuda::CUDACachingAllocator;

class History {
 public:
  // recordHistory's arguments, as torch passes them.
  void configure(bool enabled, cca::CreateContextFn recorder, size_t max_entries, cca::RecordContext when,
                 bool clear, const std::vector<std::string>& skip_actions);
  bool enabled() const { return enabled_.load(std::memory_order_acquire); }

  void on_alloc(c10::DeviceIndex device, void* ptr, size_t size, void* stream, c10::MempoolId_t pool);
  void on_free(c10::DeviceIndex device, void* ptr, size_t size);  // size 0: the one recorded at alloc
  void on_oom(c10::DeviceIndex device, size_t requested, size_t device_free, void* stream);
  // torch 2.14+'s annotateMemory: an "annotate" entry for the live allocation at `address`.
  void on_annotate(uint64_t address, const std::string& metadata);

  // The trace of `device`, oldest first (for snapshot's device_traces).
  std::vector<cca::TraceEntry> trace(c10::DeviceIndex device);
  // Where the live allocation at `ptr` was made, if it was recorded with a stack.
  std::shared_ptr<c10::GatheredContext> context_of(uint64_t address);

  void set_user_metadata(const std::string& metadata);
  std::string user_metadata();

 private:
  struct Live {
    c10::DeviceIndex device;
    size_t size;
    void* stream;
    c10::MempoolId_t pool;
    std::shared_ptr<c10::GatheredContext> context;
  };
  std::shared_ptr<c10::GatheredContext> gather(bool wanted);  // outside mutex_
  void push(cca::TraceEntry entry);                           // under mutex_
  bool skipped(cca::TraceEntry::Action action) const;         // under mutex_

  std::atomic<bool> enabled_{false};
  std::mutex mutex_;
  cca::CreateContextFn recorder_ = nullptr;
  cca::RecordContext when_ = cca::RecordContext::NEVER;
  size_t max_entries_ = 0;
  std::vector<cca::TraceEntry::Action> skip_;
  std::unordered_map<uint64_t, Live> live_;
  std::vector<std::deque<cca::TraceEntry>> traces_;  // per device
  std::string user_metadata_;
};

// The process's history (the binding's one allocator records into it).
History& history();

}  // namespace vta_torch
