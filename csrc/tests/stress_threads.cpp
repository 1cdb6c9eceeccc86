// A multithreaded stress driver for the C ABI, meant to be built with -fsanitize=thread
// (or address): threads malloc, write, offload, prefetch, ensure_resident, read and free on
// one address space while the host backend's copy-stream worker runs the copies; each thread
// also makes some allocations in a region of its own and pauses and resumes it (docs/regions.md).
// Every read checks the bytes last written; a paused allocation must refuse to be read.
// Exits 0 when all checks passed and nothing leaked.
// Not part of the library build (setup.py skips csrc/tests/); see docs/design.md.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "vtalloc/vtalloc.h"

namespace {
std::atomic<int> g_failures{0};
std::atomic<int> g_pauses{0}, g_resumes{0};  // that moved pages

void fill(std::vector<unsigned char>& buf, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
}

void worker(vta_space_t* space, int id, int steps) {
  std::mt19937 rng(id * 7919 + 1);
  struct Live {
    uint64_t addr, size, seed;
    bool tagged;
  };
  std::vector<Live> live;
  char name[16];
  std::snprintf(name, sizeof name, "t%d", id);
  uint32_t tag = 0;
  if (vta_region_tag(name, &tag) != VTA_OK) ++g_failures;
  bool paused = false;  // this thread's region; its allocations refuse reads while it is
  const uint64_t sizes[] = {512, 5000, 300000, 2u << 20, (3u << 20) + 7};
  std::vector<unsigned char> buf, got;
  for (int step = 0; step < steps; ++step) {
    int r = rng() % 100;
    if (!live.empty() && r < 25) {
      size_t i = rng() % live.size();
      Live l = live[i];
      buf.resize(l.size);
      got.resize(l.size);
      fill(buf, l.seed);
      if (l.tagged && paused) {
        if (vta_read(space, l.addr, 0, got.data(), l.size) != VTA_ERR_PAUSED) ++g_failures;
      } else if (vta_read(space, l.addr, 0, got.data(), l.size) != VTA_OK ||
                 memcmp(buf.data(), got.data(), l.size) != 0) {
        std::fprintf(stderr, "thread %d: bytes differ at %llx\n", id, (unsigned long long)l.addr);
        ++g_failures;
      }
      if (vta_free(space, l.addr) != VTA_OK) ++g_failures;
      live.erase(live.begin() + i);
    } else if (!live.empty() && r < 45) {
      const Live& l = live[rng() % live.size()];
      vta_status_t s = vta_offload(space, l.addr);
      if (l.tagged && paused ? s != VTA_ERR_PAUSED
                             : s != VTA_OK && s != VTA_ERR_INVALID_ARGUMENT && s != VTA_ERR_HOST_POOL_EXHAUSTED)
        ++g_failures;
    } else if (!live.empty() && r < 60) {
      const Live& l = live[rng() % live.size()];
      vta_status_t s = vta_restore(space, l.addr, 0, 0, (rng() % 2) ? 0u : VTA_RESTORE_WAIT);
      if (l.tagged && paused ? s != VTA_ERR_PAUSED : s != VTA_OK && s != VTA_ERR_OUT_OF_MEMORY) ++g_failures;
    } else if (r < 65) {
      uint64_t moved = 0;
      vta_status_t s = vta_region_pause(space, tag, 0, &moved);
      if (s == VTA_OK) {
        paused = true;
        if (moved) ++g_pauses;
      }
      else if (s != VTA_ERR_HOST_POOL_EXHAUSTED)  // a full host pool moves nothing
        ++g_failures;
    } else if (r < 70) {
      uint64_t moved = 0;
      vta_status_t s = vta_region_resume(space, tag, 0, &moved);
      if (s == VTA_OK) {
        paused = false;
        if (moved) ++g_resumes;
      }
      else if (s != VTA_ERR_OUT_OF_MEMORY)  // no room: all or nothing, still paused
        ++g_failures;
    } else {
      uint64_t n = sizes[rng() % 5], a = 0;
      bool tagged = rng() % 3 == 0;
      if (tagged && paused) continue;  // one made now would be resident in a paused region: kept simple
      vta_status_t s = tagged ? vta_malloc_region(space, n, 0, 0, tag, &a) : vta_malloc(space, n, 0, &a);
      if (s == VTA_ERR_OUT_OF_MEMORY) continue;
      if (s != VTA_OK) {
        ++g_failures;
        continue;
      }
      uint64_t seed = (uint64_t(id) << 32) | uint64_t(step);
      buf.resize(n);
      fill(buf, seed);
      if (vta_write(space, a, 0, buf.data(), n) != VTA_OK) ++g_failures;
      if (vta_set_evictable(space, a, 1) != VTA_OK) ++g_failures;
      live.push_back({a, n, seed, tagged});
    }
  }
  for (auto& l : live)
    if (vta_free(space, l.addr) != VTA_OK) ++g_failures;
}
}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 4, steps = argc > 2 ? std::atoi(argv[2]) : 300;
  for (uint32_t mode : {uint32_t(VTA_EVICT_MAPPED), uint32_t(VTA_EVICT_COPY)}) {
    vta_config_t c{};
    c.struct_size = sizeof c;
    c.backend = VTA_BACKEND_HOST;
    c.capacity_bytes = 24ull << 20;
    c.host_capacity_bytes = 96ull << 20;
    c.evict_mode = mode;
    vta_space_t* space = nullptr;
    if (vta_space_create(&c, &space) != VTA_OK) {
      std::fprintf(stderr, "create: %s\n", vta_last_error());
      return 2;
    }
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) workers.emplace_back(worker, space, t, steps);
    for (auto& t : workers) t.join();
    vta_stats_t st{};
    vta_stats(space, &st);
    std::printf("mode %u: %llu evictions, %llu restores, %llu pressure evictions\n", mode,
                (unsigned long long)st.evictions, (unsigned long long)st.restores,
                (unsigned long long)st.pressure_evictions);
    if (st.num_live_allocs != 0) ++g_failures;
    vta_space_close(space);
    vta_space_destroy(space);
  }
  vta_global_counters_t g{};
  g.struct_size = sizeof g;
  vta_global_counters(&g);
  if (g.live_pages || g.live_mappings || g.live_reservations || g.pinned_host_bytes || g.live_events || g.live_streams) {
    std::fprintf(stderr, "leaked: pages %llu mappings %llu reservations %llu\n", (unsigned long long)g.live_pages,
                 (unsigned long long)g.live_mappings, (unsigned long long)g.live_reservations);
    ++g_failures;
  }
  std::printf("%d region pauses and %d resumes moved pages\n", g_pauses.load(), g_resumes.load());
  std::printf("%d failures\n", g_failures.load());
  return g_failures.load() ? 1 : 0;
}
