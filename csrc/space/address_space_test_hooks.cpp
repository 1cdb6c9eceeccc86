// AddressSpace test hooks: streams of the space's own, and test kernels on them.
//
// Owns: user_streams_, the streams a test created on this space, and the launch of test
// kernels (backend/testing/host_kernels.hpp; host backend only, other backends refuse them); the read
// of the victim policy's counters (victim_counters: what a free costs the LRU), which changes nothing.
// Invariants: a kernel is launched only over a range inside one live allocation and on
// stream 0 or a user stream of this space; it runs later on the stream's worker without the
// space's lock, like a GPU kernel, so paging, restore and reclaim can race it (what the
// kernels are for). A user stream is destroyed only with no live allocation on it (frees and
// evictions record events on an allocation's stream), after its work completed; close()
// destroys the remaining ones before any page is released. Waiting for a stream
// (destroy_stream, synchronize_stream, and a kernel on stream 0, which runs on the calling
// thread) holds the space's lock: race a kernel with other calls before waiting for it.
#include <algorithm>
#include <string>

#include "space/address_space.hpp"

namespace vta {
namespace {

// `stream` is 0 (when allowed) or one of `mine`; else InvalidArgument.
void need_known_stream(const std::vector<StreamHandle>& mine, StreamHandle stream, bool allow_default) {
  if (allow_default && stream == 0) return;
  if (std::find(mine.begin(), mine.end(), stream) == mine.end())
    fail(VTA_ERR_INVALID_ARGUMENT, "unknown stream " + std::to_string(stream) + ": not " +
                                       (allow_default ? "0 or " : "") + "a stream created on this address space");
}

}  // namespace

StreamHandle AddressSpace::create_stream() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  user_streams_.reserve(user_streams_.size() + 1);  // so the push_back below cannot throw
  StreamHandle s = 0;
  check(backend_->stream_create(&s));
  user_streams_.push_back(s);
  return s;
}

void AddressSpace::destroy_stream(StreamHandle stream) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  need_known_stream(user_streams_, stream, false);
  if (policy_.live().any_on_stream(stream))
    fail(VTA_ERR_INVALID_ARGUMENT, "stream " + std::to_string(stream) + " still has live allocations; free them first");
  policy_.settle_stream(stream);  // no event may be recorded on it once it is gone
  user_streams_.erase(std::find(user_streams_.begin(), user_streams_.end(), stream));
  Status synced = backend_->stream_synchronize(stream);
  Status destroyed = backend_->stream_destroy(stream);
  check(synced);
  check(destroyed);
  policy_.drain_pending(false);  // its frees' events completed with the stream
}

void AddressSpace::synchronize_stream(StreamHandle stream) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  need_known_stream(user_streams_, stream, true);
  check(backend_->stream_synchronize(stream));
}

void AddressSpace::run_test_kernel(StreamHandle stream, uintptr_t address, uint64_t nbytes, int kind, uint64_t seed,
                                   uint64_t duration_ns) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  if (nbytes == 0) fail(VTA_ERR_INVALID_ARGUMENT, "a test kernel needs a non-empty range");
  (void)policy_.live().find_range(address, 0, nbytes);  // inside one live allocation
  need_known_stream(user_streams_, stream, true);
  check(backend_->launch_test_kernel(stream, address, nbytes, kind, seed, duration_ns));
}

void AddressSpace::victim_counters(uint64_t* candidate_pages, uint64_t* entries_touched) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  residency_.victim_counters(candidate_pages, entries_touched);
}

vta_kernel_counters_t AddressSpace::kernel_counters() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  vta_kernel_counters_t c{};
  check(backend_->test_kernel_counters(&c));
  return c;
}

}  // namespace vta
