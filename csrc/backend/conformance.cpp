// The driver-seam conformance check: the contract of backend.hpp, run against a live backend.
//
// Owns: one sequence of seam operations with known outcomes (bytes round-trip, a page mapped
// at two addresses aliases, release-while-mapped keeps memory alive, export/import shares
// bytes, and the illegal operations the CUDA rules forbid are refused). Run on host in CI
// and on cuda in the gpu tests, so host and driver are held to the same rules.
// Invariant: everything it creates is released before it returns, pass or fail.
#include <algorithm>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include "backend/backend.hpp"
#include "capi/guard.hpp"
#include "vtalloc/vtalloc.h"

namespace vta {
namespace {

class Checker {
 public:
  explicit Checker(Backend& b) : b_(b) {}
  ~Checker() {
    for (auto& [va, n] : mapped_) (void)b_.unmap(va, n);
    for (PageHandle p : pages_) (void)b_.release_page(p);
    if (va_) (void)b_.free_va(va_, va_bytes_);
  }

  void expect(bool cond, const std::string& what) {
    ++checks_;
    if (!cond) {
      ++failures_;
      report_ += "FAIL " + what + "\n";
    } else {
      report_ += "ok   " + what + "\n";
    }
  }
  void expect_ok(const Status& s, const std::string& what) { expect(s.is_ok(), what + (s.is_ok() ? "" : ": " + s.message())); }
  void expect_refused(const Status& s, const std::string& what) { expect(!s.is_ok(), what + " is refused"); }

  void run() {
    size_t g = b_.granularity();
    expect(g >= 4096 && (g & (g - 1)) == 0, "granularity is a power of two of at least 4 KiB");
    va_bytes_ = 4 * g;
    expect_ok(b_.reserve(va_bytes_, g, &va_), "reserve 4 granules");
    if (!va_) return;
    expect(va_ % g == 0, "reservation is aligned to the granularity");
    PageHandle a = 0, c = 0;
    expect_ok(b_.create_page(g, PageLocation::device, &a), "create page A");
    pages_.push_back(a);
    expect_ok(b_.map(va_, g, a), "map A at +0");
    mapped_.push_back({va_, g});
    expect_ok(b_.set_access(va_, g), "set access on A");
    std::vector<unsigned char> src(g), dst(g);
    for (size_t i = 0; i < g; ++i) src[i] = static_cast<unsigned char>((i * 131 + 7) & 0xff);
    expect_ok(b_.copy(va_, reinterpret_cast<uintptr_t>(src.data()), g, 0), "copy host -> A");
    expect_ok(b_.stream_synchronize(0), "synchronize");
    expect_ok(b_.copy(reinterpret_cast<uintptr_t>(dst.data()), va_, g, 0), "copy A -> host");
    expect_ok(b_.stream_synchronize(0), "synchronize");
    expect(src == dst, "bytes round-trip through a mapped page");

    expect_refused(b_.map(va_, g, a), "mapping over an existing mapping");
    expect_refused(b_.unmap(va_ + g, g), "unmapping a range with nothing mapped");
    expect_refused(b_.free_va(va_, va_bytes_), "freeing a reservation that still has a mapping");

    // The same physical page at a second address aliases the first.
    expect_ok(b_.map(va_ + g, g, a), "map A again at +1 granule");
    mapped_.push_back({va_ + g, g});
    expect_ok(b_.set_access(va_ + g, g), "set access on the alias");
    std::fill(dst.begin(), dst.end(), 0);
    expect_ok(b_.copy(reinterpret_cast<uintptr_t>(dst.data()), va_ + g, g, 0), "copy alias -> host");
    expect_ok(b_.stream_synchronize(0), "synchronize");
    expect(src == dst, "a page mapped twice shows the same bytes at both addresses");

    // Export / import shares the bytes (the service's path).
    int fd = -1;
    Status ex = b_.export_page(a, &fd);
    if (ex.code() == VTA_ERR_BACKEND_UNAVAILABLE) {
      report_ += "skip export/import: " + ex.message() + "\n";
    } else {
      expect_ok(ex, "export A as a file descriptor");
      if (fd >= 0) {
        expect_ok(b_.import_page(fd, g, &c), "import A's descriptor");
        close(fd);
        if (c) {
          pages_.push_back(c);
          expect_ok(b_.map(va_ + 2 * g, g, c), "map the imported page at +2 granules");
          mapped_.push_back({va_ + 2 * g, g});
          expect_ok(b_.set_access(va_ + 2 * g, g), "set access on the imported page");
          std::fill(dst.begin(), dst.end(), 0);
          expect_ok(b_.copy(reinterpret_cast<uintptr_t>(dst.data()), va_ + 2 * g, g, 0), "copy import -> host");
          expect_ok(b_.stream_synchronize(0), "synchronize");
          expect(src == dst, "an imported page shows the exporter's bytes");
        }
      }
    }

    // Releasing a mapped page is legal; its memory lives until the last unmap.
    expect_ok(b_.release_page(a), "release A while it is still mapped");
    pages_.erase(pages_.begin());
    std::fill(dst.begin(), dst.end(), 0);
    expect_ok(b_.copy(reinterpret_cast<uintptr_t>(dst.data()), va_, g, 0), "copy released-but-mapped A -> host");
    expect_ok(b_.stream_synchronize(0), "synchronize");
    expect(src == dst, "a released page keeps its bytes while mapped");

    EventHandle e = 0;
    expect_ok(b_.event_create(&e), "create an event");
    expect_ok(b_.event_record(e, 0), "record it on the default stream");
    expect_ok(b_.event_synchronize(e), "wait for it");
    bool done = false;
    expect_ok(b_.event_query(e, &done), "query it");
    expect(done, "a waited-for event is complete");
    expect_ok(b_.event_destroy(e), "destroy the event");

    void* host = nullptr;
    expect_ok(b_.host_alloc_pinned(g, &host), "allocate pinned host memory");
    if (host) {
      std::memcpy(host, src.data(), g);
      expect_ok(b_.copy(va_ + 2 * g, reinterpret_cast<uintptr_t>(host), g, 0), "copy pinned host -> device");
      expect_ok(b_.stream_synchronize(0), "synchronize");
      expect_ok(b_.host_free_pinned(host, g), "free pinned host memory");
    }

    for (auto it = mapped_.rbegin(); it != mapped_.rend(); ++it) expect_ok(b_.unmap(it->first, it->second), "unmap");
    mapped_.clear();
    for (PageHandle p : pages_) expect_ok(b_.release_page(p), "release page");
    pages_.clear();
    expect_ok(b_.free_va(va_, va_bytes_), "free the reservation once nothing is mapped");
    va_ = 0;
  }

  int failures() const { return failures_; }
  int checks() const { return checks_; }
  const std::string& report() const { return report_; }

 private:
  Backend& b_;
  uintptr_t va_ = 0;
  size_t va_bytes_ = 0;
  std::vector<PageHandle> pages_;
  std::vector<std::pair<uintptr_t, size_t>> mapped_;
  std::string report_;
  int checks_ = 0, failures_ = 0;
};

}  // namespace
}  // namespace vta

extern "C" vta_status_t vta_backend_conformance(int32_t backend, int32_t device, char* report, uint64_t report_len,
                                                int32_t* out_failures) {
  return vta::capi::guarded([&] {
    vta::capi::need(out_failures, "failures output");
    vta::BackendOptions opts;
    opts.kind = backend;
    opts.device = device;
    opts.host_device_bytes = 64ull << 20;
    std::unique_ptr<vta::Backend> b;
    vta::check(vta::make_backend(opts, &b));
    std::string text;
    {
      vta::Checker c(*b);
      c.run();
      *out_failures = c.failures();
      text = std::string(b->name()) + ": " + std::to_string(c.checks()) + " checks, " +
             std::to_string(c.failures()) + " failed\n" + c.report();
    }
    if (report && report_len) {
      size_t n = std::min<size_t>(text.size(), report_len - 1);
      std::memcpy(report, text.data(), n);
      report[n] = 0;
    }
  });
}
