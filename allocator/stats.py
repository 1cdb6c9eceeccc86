"""Typed, frozen records of what an address space holds: Stats, PageRecord, AllocationRecord.

Stats use PyTorch's words where the meaning is the same (allocated = as requested, active =
rounded up, peak), plus the page-level numbers only a paged allocator has.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Stats", "PageRecord", "AllocationRecord", "PAGE_STATES"]

PAGE_STATES = ("free", "cached", "allocated")


@dataclasses.dataclass(frozen=True)
class Stats:
    capacity_bytes: int          # most bytes of physical pages this space may hold
    page_bytes: int              # bytes per physical page
    small_threshold_bytes: int   # allocations up to this size are packed into shared pages
    allocated_bytes: int         # live allocations, as requested
    active_bytes: int            # live allocations, rounded (512 B blocks or whole pages)
    mapped_bytes: int            # physical pages mapped into the virtual space
    cached_bytes: int            # mapped bytes under no live allocation (free for fast reuse)
    peak_allocated_bytes: int
    peak_active_bytes: int
    peak_mapped_bytes: int
    reserved_va_bytes: int       # virtual address space reserved
    num_reservations: int
    pages_total: int             # physical pages held (mapped or not)
    pages_mapped: int
    pages_free: int              # held but unmapped
    num_live_allocs: int
    num_allocs: int
    num_frees: int
    num_ooms: int
    num_page_reclaims: int       # cached pages unmapped and remapped to serve a new allocation
    num_map_calls: int
    num_unmap_calls: int
    pending_free_bytes: int      # freed, waiting for the stream that used them

    @property
    def fragmentation(self) -> float:
        """1 - active / mapped: the share of mapped memory not under a live allocation."""
        return 0.0 if self.mapped_bytes == 0 else 1.0 - min(self.active_bytes, self.mapped_bytes) / self.mapped_bytes

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AllocationRecord:
    address: int
    size_bytes: int       # rounded
    requested_bytes: int
    stream: int


@dataclasses.dataclass(frozen=True)
class PageRecord:
    page_id: int
    address: int | None   # where it is mapped; None when unmapped
    state: str            # "free" (held, unmapped), "cached" (mapped, no live data), "allocated"
    allocations: tuple[int, ...]  # addresses of the live allocations on this page
