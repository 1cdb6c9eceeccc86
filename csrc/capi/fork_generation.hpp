// The fork generation of this process, for the C ABI's handles.
//
// Owns: a counter that a pthread_atfork child handler bumps (registered at the first call), so
// a handle made before a fork() can tell, with one relaxed load instead of a getpid() system
// call per call, that it is now in the child.
// Invariant: a handle whose recorded generation differs from fork_generation() belongs to the
// parent: the C ABI refuses it (VTA_ERR_CLOSED), its close does nothing, and its destroy
// leaks the native object rather than release the parent's pages, mappings and descriptors
// (the child shares the memfd pages; its stream threads do not exist in the child).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

namespace vta::capi {

inline std::atomic<uint64_t>& fork_generation_counter() {
  static std::atomic<uint64_t> generation{0};
  return generation;
}

inline uint64_t fork_generation() {
  static const bool registered =
      pthread_atfork(nullptr, nullptr, [] { fork_generation_counter().fetch_add(1); }) == 0;
  (void)registered;
  return fork_generation_counter().load(std::memory_order_relaxed);
}

constexpr const char* kForkedMessage =
    " was created by the process that forked this one: a child shares its pages and must not use "
    "it; create a new one after fork";

}  // namespace vta::capi
