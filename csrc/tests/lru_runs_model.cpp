// lru_runs_model: LruPolicy (csrc/evict/lru_policy.hpp), which stores its candidates as runs of
// pages, checked against the list of pages it stands for, under random calls.
//
// Owns: the model (a std::list of pages, the LRU as it was stored before runs) and the random
// driver; built and run by tests/test_lru_runs.py. Usage: lru_runs_model SEEDS OPS.
// Invariants: after every call visit() offers exactly the model's pages in the model's order,
// candidate_pages() is the model's size, and a forget_range() touches no more runs than there
// are; a visitor that takes a page stops the walk there. Prints "0 failures" when all held.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <random>
#include <vector>

#include "evict/lru_policy.hpp"

namespace {

constexpr uintptr_t kPage = 4096, kBase = 1u << 20;

struct Model {
  std::list<uintptr_t> order;
  void forget(uintptr_t va) { order.remove(va); }
  void note_use(uintptr_t va) {
    forget(va);
    order.push_back(va);
  }
  void forget_range(uintptr_t lo, uintptr_t hi) {
    order.remove_if([&](uintptr_t va) { return va >= lo && va < hi; });
  }
};

std::vector<uintptr_t> pages_of(const vta::LruPolicy& lru) {
  std::vector<uintptr_t> out;
  lru.visit([&](uintptr_t va) {
    out.push_back(va);
    return false;
  });
  return out;
}

int check(const vta::LruPolicy& lru, const Model& m, unsigned seed, int op) {
  std::vector<uintptr_t> want(m.order.begin(), m.order.end());
  if (pages_of(lru) == want && lru.candidate_pages() == want.size()) return 0;
  std::printf("seed %u op %d: the runs differ from the page list (%zu vs %zu pages)\n", seed, op, pages_of(lru).size(),
              want.size());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  unsigned seeds = argc > 1 ? static_cast<unsigned>(std::atoi(argv[1])) : 50;
  int ops = argc > 2 ? std::atoi(argv[2]) : 2000;
  int failures = 0;
  for (unsigned seed = 1; seed <= seeds && !failures; ++seed) {
    std::mt19937 rng(seed);
    vta::LruPolicy lru(kPage);
    Model m;
    const uint32_t span = 8 + seed % 64;  // pages in play: few (many collisions) to more
    auto page = [&] { return kBase + rng() % span * kPage; };
    for (int op = 0; op < ops && !failures; ++op) {
      uint32_t kind = rng() % 10;
      if (kind < 4) {  // a walk over an "allocation", as note_use does: consecutive pages
        uintptr_t lo = page();
        uint32_t n = 1 + rng() % 6;
        for (uint32_t k = 0; k < n; ++k) {
          lru.note_use(lo + k * kPage);
          m.note_use(lo + k * kPage);
        }
      } else if (kind < 6) {
        uintptr_t va = page();
        lru.forget(va);
        m.forget(va);
      } else if (kind < 9) {
        uintptr_t a = page(), b = page() + kPage;
        uintptr_t lo = std::min(a, b), hi = std::max(a, b);
        uint64_t before = lru.entries_touched();
        lru.forget_range(lo, hi);
        m.forget_range(lo, hi);
        if (lru.entries_touched() - before > (hi - lo) / kPage) {
          std::printf("seed %u op %d: forget_range of pages [%lu, %lu) touched %lu runs\n", seed, op,
                      static_cast<unsigned long>(lo / kPage), static_cast<unsigned long>(hi / kPage),
                      static_cast<unsigned long>(lru.entries_touched() - before));
          failures++;
        }
      } else {  // the visitor takes the k-th candidate: the walk stops there
        std::vector<uintptr_t> seen;
        size_t k = m.order.empty() ? 0 : rng() % m.order.size();
        bool took = lru.visit([&](uintptr_t va) {
          seen.push_back(va);
          return seen.size() == k + 1;
        });
        if (took != !m.order.empty() || seen.size() != std::min(k + 1, m.order.size())) {
          std::printf("seed %u op %d: visit did not stop at the taken page\n", seed, op);
          failures++;
        }
        if (kind == 9 && rng() % 2) {
          lru.clear();
          m.order.clear();
        }
      }
      failures += check(lru, m, seed, op);
    }
  }
  std::printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
