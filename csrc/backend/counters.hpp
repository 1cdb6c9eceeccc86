// Process-wide accounting of what the backends hold (invariant 5: full accounting).
//
// Owns: atomic counters bumped by every backend implementation when it creates or releases
// a page, a reservation, a mapping, pinned host memory, an event or a stream. Tests check
// that all of them return to zero once every address space is closed.
#pragma once

#include <atomic>
#include <cstdint>

namespace vta {

struct GlobalCounters {
  std::atomic<int64_t> live_spaces{0};
  std::atomic<int64_t> live_pages{0};
  std::atomic<int64_t> live_page_bytes{0};
  std::atomic<int64_t> live_reservations{0};
  std::atomic<int64_t> reserved_va_bytes{0};
  std::atomic<int64_t> live_mappings{0};
  std::atomic<int64_t> pinned_host_bytes{0};
  std::atomic<int64_t> live_events{0};
  std::atomic<int64_t> live_streams{0};
};

GlobalCounters& global_counters();

}  // namespace vta
