// TestingSpace and TestExtension (testing_space.hpp): the test hooks of an address space.
//
// Owns: the installation of TestExtension as the process's space extension (a static
// initializer: the library's every space has one); the hooks' argument checks; the launch of
// test kernels (host backend only, other backends refuse them) and the read of the victim
// policy's counters, which changes nothing.
// Invariants: a kernel is launched only over a range inside one live allocation and on
// stream 0 or a user stream of this space; it runs later on the stream's worker without the
// space's lock, like a GPU kernel, so paging, restore and reclaim can race it (what the
// kernels are for). A user stream is destroyed only with no live allocation on it (frees and
// evictions record events on an allocation's stream), after its work completed; closing
// destroys the remaining ones before any page is released. Waiting for a stream
// (destroy_stream, synchronize_stream, and a kernel on stream 0, which runs on the calling
// thread) holds the space's lock: race a kernel with other calls before waiting for it.
#include "space/testing/testing_space.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace vta {
namespace {

std::unique_ptr<SpaceExtension> make_test_extension() { return std::make_unique<TestExtension>(); }

// Installed as the library loads, before any space can be made (space_extension.hpp).
[[maybe_unused]] const bool installed = (set_space_extension_factory(&make_test_extension), true);

// `stream` is 0 (when allowed) or one of `mine`; else InvalidArgument.
void need_known_stream(const std::vector<StreamHandle>& mine, StreamHandle stream, bool allow_default) {
  if (allow_default && stream == 0) return;
  if (std::find(mine.begin(), mine.end(), stream) == mine.end())
    fail(VTA_ERR_INVALID_ARGUMENT, "unknown stream " + std::to_string(stream) + ": not " +
                                       (allow_default ? "0 or " : "") + "a stream created on this address space");
}

TestExtension& extension_of(AddressSpace& space) {
  auto* ext = dynamic_cast<TestExtension*>(space.extension());
  if (!ext) fail(VTA_ERR_BACKEND_UNAVAILABLE, "this address space has no test extension (none was installed)");
  return *ext;
}

}  // namespace

std::unique_ptr<Backend> TestExtension::adapt(std::unique_ptr<Backend> backend) {
  auto faults = std::make_unique<FaultInjectingBackend>(std::move(backend));
  faults_ = faults.get();
  return faults;
}

void TestExtension::closing(Backend& backend) noexcept {
  for (StreamHandle s : streams_) {  // their kernels end before the space's pages go
    (void)backend.stream_synchronize(s);
    (void)backend.stream_destroy(s);
  }
  streams_.clear();
}

TestingSpace::TestingSpace(AddressSpace& space) : space_(space), ext_(extension_of(space)) {}

void TestingSpace::inject_fault(int op, int times, int skip) {
  if (op < 0 || op >= static_cast<int>(FaultOp::count) || times < 0 || skip < 0)
    fail(VTA_ERR_INVALID_ARGUMENT, "inject_fault: unknown operation or negative count");
  space_.with_parts([&](SpaceParts&) { ext_.faults_->inject(static_cast<FaultOp>(op), times, skip); });
}

void TestingSpace::break_ordering(uint32_t mask) {
  constexpr uint32_t known = VTA_DEBUG_BREAK_QUIESCE | VTA_DEBUG_BREAK_COPY_ORDER | VTA_DEBUG_BREAK_FREE_WAIT;
  if (mask & ~known) fail(VTA_ERR_INVALID_ARGUMENT, "break_ordering: unknown bits");
  space_.with_parts([&](SpaceParts& p) {
    p.policy.set_skip_free_wait((mask & VTA_DEBUG_BREAK_FREE_WAIT) != 0);
    p.policy.set_skip_quiesce((mask & VTA_DEBUG_BREAK_QUIESCE) != 0);  // an extent split's wait
    p.residency.set_debug_break(mask);
  });
}

StreamHandle TestingSpace::create_stream() {
  return space_.with_parts([&](SpaceParts& p) {
    ext_.streams_.reserve(ext_.streams_.size() + 1);  // so the push_back below cannot throw
    StreamHandle s = 0;
    check(p.backend.stream_create(&s));
    ext_.streams_.push_back(s);
    return s;
  });
}

void TestingSpace::destroy_stream(StreamHandle stream) {
  space_.with_parts([&](SpaceParts& p) {
    need_known_stream(ext_.streams_, stream, false);
    if (p.policy.live().any_on_stream(stream))
      fail(VTA_ERR_INVALID_ARGUMENT, "stream " + std::to_string(stream) + " still has live allocations; free them first");
    p.policy.settle_stream(stream);  // no event may be recorded on it once it is gone
    ext_.streams_.erase(std::find(ext_.streams_.begin(), ext_.streams_.end(), stream));
    Status synced = p.backend.stream_synchronize(stream);
    Status destroyed = p.backend.stream_destroy(stream);
    check(synced);
    check(destroyed);
    p.policy.drain_pending(false);  // its frees' events completed with the stream
  });
}

void TestingSpace::synchronize_stream(StreamHandle stream) {
  space_.with_parts([&](SpaceParts& p) {
    need_known_stream(ext_.streams_, stream, true);
    check(p.backend.stream_synchronize(stream));
  });
}

void TestingSpace::run_test_kernel(StreamHandle stream, uintptr_t address, uint64_t nbytes, int kind, uint64_t seed,
                                   uint64_t duration_ns) {
  space_.with_parts([&](SpaceParts& p) {
    if (nbytes == 0) fail(VTA_ERR_INVALID_ARGUMENT, "a test kernel needs a non-empty range");
    (void)p.policy.live().find_range(address, 0, nbytes);  // inside one live allocation
    need_known_stream(ext_.streams_, stream, true);
    check(p.backend.launch_test_kernel(stream, address, nbytes, kind, seed, duration_ns));
  });
}

vta_kernel_counters_t TestingSpace::kernel_counters() {
  return space_.with_parts([&](SpaceParts& p) {
    vta_kernel_counters_t c{};
    check(p.backend.test_kernel_counters(&c));
    return c;
  });
}

void TestingSpace::victim_counters(uint64_t* candidate_pages, uint64_t* entries_touched) {
  space_.with_parts([&](SpaceParts& p) { p.residency.victim_counters(candidate_pages, entries_touched); });
}

}  // namespace vta
