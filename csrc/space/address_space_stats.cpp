// AddressSpace introspection: stats, the page map and the list of allocations.
//
// Owns: the assembly of vta_stats_t from its parts (the policy's counters, the page table's,
// the engine's, the driver calls the call-counting backend saw), the cost model's clock read
// from under the counter, and the state each page is reported in.
// Invariants: read-only but for completing finished copies (pages()) and sealing the open
// pending frees (stats() and pages(): one event per stream that has some, then the completed
// ones are released, so what they report is what any stream could reuse); a page is reported
// once: a device page with its state, or, for an evicted virtual page whose device page was
// released, a row with page_id VTA_NO_PAGE.
#include <unordered_map>

#include "space/address_space.hpp"

namespace vta {

vta_stats_t AddressSpace::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.settle();  // a free shows as cached once its stream passed it, as any stream sees it
  vta_stats_t s{};
  s.struct_size = sizeof(vta_stats_t);
  policy_.fill_stats(&s);
  s.mapped_bytes = pages_.pages_mapped() * page_bytes_;
  s.reserved_va_bytes = pages_.reserved_bytes();
  s.num_reservations = pages_.reservations().size();
  s.pages_total = pages_.pages_held();
  s.pages_mapped = pages_.pages_mapped();
  s.pages_free = pages_.pages_unmapped();
  s.peak_mapped_bytes = pages_.peak_pages_mapped() * page_bytes_;
  s.peak_pages_total = pages_.peak_pages_held();
  s.page_bytes_created_total = pages_.pages_adopted_total() * page_bytes_;
  s.page_bytes_released_total = pages_.pages_released_total() * page_bytes_;
  s.pages_resident = pages_.pages_mapped() - policy_.cached_bytes() / page_bytes_;
  residency_.fill_stats(&s);  // and subtracts the held device pages from pages_resident
  fill_call_counts(&s);
  return s;
}

void AddressSpace::fill_call_counts(vta_stats_t* s) const {
  const CallCountingBackend& c = *calls_;
  s->num_map_calls = c.calls(DriverCall::map);
  s->num_unmap_calls = c.calls(DriverCall::unmap);
  s->num_create_page_calls = c.calls(DriverCall::create_page);
  s->num_release_page_calls = c.calls(DriverCall::release_page);
  s->num_set_access_calls = c.calls(DriverCall::set_access);
  s->num_copy_calls = c.calls(DriverCall::copy);
  s->num_event_record_calls = c.calls(DriverCall::event_record);
  s->num_event_query_calls = c.calls(DriverCall::event_query);
  s->num_event_synchronize_calls = c.calls(DriverCall::event_synchronize);
  s->num_stream_wait_event_calls = c.calls(DriverCall::stream_wait_event);
  s->num_stream_synchronize_calls = c.calls(DriverCall::stream_synchronize);
  s->num_device_synchronize_calls = c.calls(DriverCall::device_synchronize);
  s->num_reserve_calls = c.calls(DriverCall::reserve);
  s->num_free_va_calls = c.calls(DriverCall::free_va);
}

bool AddressSpace::modeled_ns(uint64_t* out) {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();  // close() released the chain calls_ sits in
  return modeled_host_ns(calls_->inner(), out);  // the model sits under the counter
}

void AddressSpace::reset_peak_stats() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.reset_peak();
  pages_.reset_peak();
}

std::vector<vta_page_info_t> AddressSpace::pages() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  policy_.settle();
  residency_.drain_inflight(false);
  using State = Residency::State;
  const LiveAllocations& live = policy_.live();
  const auto& away = residency_.away();
  auto count_allocs = [&](uintptr_t va) {
    uint32_t n = 0;
    live.for_each_on_page(va, [&](uintptr_t, const Allocation&) { ++n; });
    return n;
  };
  std::unordered_map<int32_t, uintptr_t> restoring;  // device handle id -> the first address it fills
  for (auto& [va, p] : away)
    if ((p.state == State::restoring || p.state == State::restored) && p.device_page >= 0)
      restoring[p.device_page] = va;
  std::vector<vta_page_info_t> out;
  pages_.for_each_page([&](int32_t id, uint32_t k, uintptr_t va) {
    vta_page_info_t info{};
    info.page_id = static_cast<uint64_t>(id);
    info.address = va;
    info.tag = pages_.tag_of(id);
    auto r = restoring.find(id);
    const Residency::AwayPage* a = va ? residency_.away_at(va) : nullptr;
    if (r != restoring.end()) {
      info.address = r->second + k * page_bytes_;
      info.state = VTA_PAGE_IN_FLIGHT;
      info.num_allocs = count_allocs(info.address);
    } else if (va == 0) {
      info.state = VTA_PAGE_FREE;
    } else if (a) {
      // Being evicted, or evicted with its device handle not yet released.
      info.state = a->state == State::evicted ? VTA_PAGE_EVICTED : VTA_PAGE_IN_FLIGHT;
      info.num_allocs = count_allocs(va);
    } else {
      info.num_allocs = count_allocs(va);
      info.state = policy_.page_in_use(va) ? VTA_PAGE_ALLOCATED : VTA_PAGE_CACHED;  // some block touches it
    }
    out.push_back(info);
  });
  for (auto& [va, p] : away) {
    if (p.state != State::evicted || p.device_held) continue;  // the others were listed with their device handle
    for (uint32_t k = 0; k < p.npages; ++k) {
      vta_page_info_t info{};
      info.page_id = VTA_NO_PAGE;
      info.address = va + k * page_bytes_;
      info.state = VTA_PAGE_EVICTED;
      info.num_allocs = count_allocs(info.address);
      out.push_back(info);
    }
  }
  return out;
}

std::vector<vta_alloc_info_t> AddressSpace::allocations() {
  std::lock_guard<std::mutex> lk(mu_);
  check_open_locked();
  const LiveAllocations::Map& live = policy_.live().all();
  std::vector<vta_alloc_info_t> out;
  out.reserve(live.size());
  for (auto& [addr, a] : live)
    if (!a.kept) out.push_back(vta_alloc_info_t{addr, a.size, a.requested, a.stream});
  return out;
}

}  // namespace vta
