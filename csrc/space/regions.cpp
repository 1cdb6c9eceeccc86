// Regions: the totals and rows of one space's regions (see regions.hpp).
//
// Owns: nothing beyond regions.hpp's.
// Invariants: those of regions.hpp; the rows are computed from the live allocations and the away
// pages when asked (a pass over each), nothing is cached between calls.
#include "space/regions.hpp"

#include <cstring>

#include "alloc/region_tags.hpp"

namespace vta {

uint64_t Regions::ns_since(Clock::time_point t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

void Regions::paused(uint32_t region, uint64_t page_bytes, Clock::time_point since) {
  Totals& t = totals_[region];
  if (page_bytes) t.pauses++;
  t.bytes_paused += page_bytes;
  t.pause_ns += ns_since(since);
}

void Regions::resumed(uint32_t region, uint64_t page_bytes, Clock::time_point since) {
  Totals& t = totals_[region];
  if (page_bytes) t.resumes++;
  t.bytes_resumed += page_bytes;
  t.resume_ns += ns_since(since);
}

std::vector<std::pair<uintptr_t, uint64_t>> Regions::spans(const LiveAllocations& live, uint32_t region) {
  std::vector<std::pair<uintptr_t, uint64_t>> out;
  if (!live.tagged()) return out;
  for (auto& [address, a] : live.all())
    if (a.region == region) out.push_back({address, a.size});
  return out;
}

std::vector<vta_region_info_t> Regions::infos(const LiveAllocations& live, const Residency& residency) const {
  std::map<uint32_t, vta_region_info_t> rows;
  auto row = [&](uint32_t region) -> vta_region_info_t& {
    auto it = rows.find(region);
    if (it != rows.end()) return it->second;
    vta_region_info_t r{};
    r.struct_size = sizeof r;
    r.region = region;
    std::string name = region_tag_name(region);
    std::strncpy(r.tag, name.c_str(), sizeof r.tag - 1);
    return rows.emplace(region, r).first->second;
  };
  for (auto& [region, t] : totals_) {
    vta_region_info_t& r = row(region);
    r.pauses = t.pauses;
    r.resumes = t.resumes;
    r.bytes_paused_total = t.bytes_paused;
    r.bytes_resumed_total = t.bytes_resumed;
    r.pause_ns_total = t.pause_ns;
    r.resume_ns_total = t.resume_ns;
  }
  if (live.tagged())
    for (auto& [address, a] : live.all()) {
      if (!a.region) continue;
      vta_region_info_t& r = row(a.region);
      r.allocations++;
      r.bytes += a.size;
      uint64_t paused = 0, discarded = 0;
      residency.paused_bytes(address, a.size, &paused, &discarded);
      r.paused_bytes += paused;
      r.discarded_bytes += discarded;
    }
  if (residency.paused_pages())
    for (auto& [va, p] : residency.away()) {
      if (!p.paused) continue;
      uint32_t region = 0;
      live.for_each_in(va, uint64_t{p.npages} * page_bytes_, [&](uintptr_t, const Allocation& a) { region = a.region; });
      if (!region) continue;  // no block on it any more: dropped at the free's completion
      vta_region_info_t& r = row(region);
      if (!p.device_held) r.paused_page_bytes += uint64_t{p.npages} * page_bytes_;
      for (const HostPool::Slot& s : p.slots) r.host_bytes += uint64_t{s.npages} * page_bytes_;
    }
  std::vector<vta_region_info_t> out;
  out.reserve(rows.size());
  for (auto& [region, r] : rows) out.push_back(r);
  return out;
}

}  // namespace vta
