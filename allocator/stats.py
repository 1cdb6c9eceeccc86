"""Typed, frozen records of what an address space holds: Stats, PageRecord, AllocationRecord.

Stats use PyTorch's words where the meaning is the same (allocated = as requested, active =
rounded up, peak), plus the page-level numbers only a paged allocator has. ``str(stats)`` is a few
grouped lines of at most 100 characters (:func:`stats_text`); ``repr`` keeps every field.
"""

from __future__ import annotations

import dataclasses

from .config import format_size

__all__ = ["Stats", "PageRecord", "AllocationRecord", "KernelCounters", "RegionStats", "PAGE_STATES", "DRIVER_CALL_FIELDS",
           "LATER_DRIVER_CALL_FIELDS", "fragmentation", "stats_text"]

PAGE_STATES = ("free", "cached", "allocated", "evicted", "in_flight")
# The driver call counters at the end of vta_stats_t, in its order (map and unmap come earlier).
DRIVER_CALL_FIELDS = (
    "num_create_page_calls", "num_release_page_calls", "num_set_access_calls", "num_copy_calls",
    "num_event_record_calls", "num_event_query_calls", "num_event_synchronize_calls",
    "num_stream_wait_event_calls", "num_stream_synchronize_calls", "num_reserve_calls", "num_free_va_calls",
)
# Driver call counters appended to vta_stats_t later, at its very end.
LATER_DRIVER_CALL_FIELDS = ("num_device_synchronize_calls",)


def fragmentation(active_bytes: int, mapped_bytes: int, evicted_bytes: int = 0) -> float:
    """The share of the mapped device memory that holds no live data:
    1 - (active - evicted) / mapped, 0 when nothing is mapped.

    An evicted allocation stays live (in ``active_bytes``) but its bytes are in host memory,
    not under the mapped pages, so its pages (``evicted_bytes``) are taken out of the live
    bytes; a device page an evicted page still holds mapped counts as mapped and unused. Exact
    when the evicted pages are full of live data; for an evicted page that also holds free
    bytes (pages are shared between blocks) it counts those as evicted too (an upper bound
    then). The result
    is bounded to [0, 1]: pages in flight (restoring, not yet mapped) may make the live bytes
    on the device exceed the mapped ones for a moment.
    """
    if mapped_bytes <= 0:
        return 0.0
    on_device = max(0, active_bytes - evicted_bytes)
    return 1.0 - min(on_device, mapped_bytes) / mapped_bytes


@dataclasses.dataclass(frozen=True)
class Stats:
    capacity_bytes: int          # most bytes of physical pages this space may hold
    page_bytes: int              # bytes per physical page
    small_threshold_bytes: int   # allocations up to this size are PyTorch's small pool in the statistics
    allocated_bytes: int         # live allocations, as requested
    active_bytes: int            # live allocations, rounded up to whole 512 B blocks
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
    num_ooms: int                # OutOfMemoryErrors raised to callers (a leased space's first tries that
                                 # its page source then served are not counted)
    num_page_reclaims: int       # cached pages unmapped and remapped to serve a new allocation
    num_map_calls: int           # every driver map call (cuMemMap) of this space, eviction's included
    num_unmap_calls: int         # every driver unmap call (cuMemUnmap)
    pending_free_bytes: int      # freed; reusable at once on their own stream, by others once it passed them
    # eviction engine
    evict_mode: str              # "mapped" or "copy": the active mode
    pages_resident: int          # device pages under live data
    pages_evicted: int           # virtual pages whose bytes are in the host pool
    pages_in_flight: int         # being evicted or restored
    evicted_bytes: int
    evictable_bytes: int         # live allocations marked evictable (rounded)
    evictions: int               # pages evicted (completed), pressure included
    pressure_evictions: int      # pages malloc evicted under memory pressure
    restores: int
    bytes_evicted_total: int
    bytes_restored_total: int
    host_pool_capacity_bytes: int
    host_pool_bytes: int         # host memory pinned (or host pages created) so far; reused
    host_pool_used_bytes: int    # holding evicted pages now
    restore_wait_ns: int         # time callers blocked in ensure_resident / reads waiting for restores
    evict_copy_ns: int           # issue-to-completion time of eviction copies (an upper bound)
    restore_copy_ns: int         # issue-to-completion time of restore copies (an upper bound)
    # driver calls of this space by kind (with num_map_calls / num_unmap_calls): what a page
    # move costs is mostly calls, not bytes; DRIVER_CALL_FIELDS lists them
    num_create_page_calls: int      # cuMemCreate (device and host pages)
    num_release_page_calls: int     # cuMemRelease
    num_set_access_calls: int       # cuMemSetAccess
    num_copy_calls: int             # cuMemcpyAsync
    num_event_record_calls: int     # cuEventRecord
    num_event_query_calls: int      # cuEventQuery
    num_event_synchronize_calls: int  # cuEventSynchronize (a host wait)
    num_stream_wait_event_calls: int  # cuStreamWaitEvent
    num_stream_synchronize_calls: int  # cuStreamSynchronize (a host wait)
    num_reserve_calls: int          # cuMemAddressReserve
    num_free_va_calls: int          # cuMemAddressFree
    peak_pages_total: int           # most pages held at once (PyTorch's peak reserved, in pages)
    # cumulative since creation: PyTorch's "allocated" / "freed" columns
    allocated_bytes_total: int = 0        # every allocation's bytes, rounded
    freed_bytes_total: int = 0            # every free's bytes, rounded
    requested_bytes_total: int = 0        # every allocation's bytes, as requested
    requested_freed_bytes_total: int = 0  # every free's bytes, as requested
    page_bytes_created_total: int = 0     # physical page bytes that came to be held
    page_bytes_released_total: int = 0    # physical page bytes released
    num_alloc_retries: int = 0            # allocations that reclaimed cached pages or waited for frees
    num_sync_all_streams: int = 0         # waits for the pending frees of every stream
    # extent splits, at the edge of an OOM: the blocks on an extent they use only in part moved to
    # handles of their own at the same addresses, the extent's untouched pages released
    num_extent_splits: int = 0            # extents split
    num_extent_splits_staged: int = 0     # of those, staged through host memory (no room beside the extent)
    extent_split_pages: int = 0           # pages whose bytes the splits copied
    num_device_synchronize_calls: int = 0  # cuCtxSynchronize (a host wait for every stream): extent splits

    @property
    def evict_bandwidth_bytes_per_s(self) -> float:
        """Achieved eviction copy bandwidth (bytes over issue-to-completion time)."""
        return self.bytes_evicted_total / (self.evict_copy_ns / 1e9) if self.evict_copy_ns else 0.0

    @property
    def restore_bandwidth_bytes_per_s(self) -> float:
        return self.bytes_restored_total / (self.restore_copy_ns / 1e9) if self.restore_copy_ns else 0.0

    @property
    def fragmentation(self) -> float:
        """1 - (active - evicted) / mapped: the share of mapped memory under no live data (see fragmentation())."""
        return fragmentation(self.active_bytes, self.mapped_bytes, self.evicted_bytes)

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        """A few grouped lines (:func:`stats_text`); ``repr()`` keeps every field on one line."""
        return stats_text(self)

    def driver_calls(self) -> dict[str, int]:
        """Driver calls by kind ("map", "unmap", "set_access", "event_record", ...)."""
        return {f[len("num_"):-len("_calls")]: getattr(self, f) for f in ("num_map_calls", "num_unmap_calls", *DRIVER_CALL_FIELDS,
                                                                  *LATER_DRIVER_CALL_FIELDS)}


@dataclasses.dataclass(frozen=True)
class AllocationRecord:
    address: int
    size_bytes: int       # rounded
    requested_bytes: int
    stream: int


@dataclasses.dataclass(frozen=True)
class PageRecord:
    page_id: int | None   # the physical page; None for an evicted virtual page (no device page)
    address: int | None   # where it is mapped (or, evicted, the virtual page); None when unmapped
    state: str            # "free" (held, unmapped), "cached" (mapped, no live data), "allocated",
                          # "evicted" (bytes in the host pool), "in_flight" (being evicted or restored)
    allocations: tuple[int, ...]  # addresses of the live allocations on this page
    tag: int | None = None  # a leased page: the service's id for it (AddressSpace.import_page)


@dataclasses.dataclass(frozen=True)
class KernelCounters:
    """Test kernels and guarded copies of one host-backend address space (tests only).

    A fault is an access to an address that was not mapped at that moment: on a GPU it would
    poison the CUDA context; the host backend stops that kernel or copy, counts it, carries on.
    """

    kernels_launched: int
    kernels_completed: int
    kernels_faulted: int       # stopped by a fault
    copy_faults: int           # backend copies abandoned on a fault (their bytes are corrupt)
    bytes_checked: int         # by CHECK kernels, once per completed pass
    bytes_mismatched: int      # of those, bytes that differed from the pattern

    @property
    def kernels_running(self) -> int:
        """Launched and not yet ended (queued or running)."""
        return self.kernels_launched - self.kernels_completed - self.kernels_faulted


def _lines(label: str, phrases: list[str], width: int = 100) -> list[str]:
    """``phrases`` joined by ", " after ``label``, broken between phrases (never inside one)."""
    head, indent = f"  {label:<12}" if label else "", " " * 14
    out, line, fresh = [], head, True
    for n, phrase in enumerate(phrases):
        piece = phrase + ("," if n < len(phrases) - 1 else "")
        if fresh:
            line, fresh = line + piece, False
        elif len(line) + 1 + len(piece) > width:
            out.append(line)
            line = indent + piece
        else:
            line = f"{line} {piece}"
    return out + [line]


def stats_text(s: Stats) -> str:
    """A few grouped lines, none over 100 characters unless one phrase is (what ``print(stats)``
    shows); ``repr(stats)`` has every field."""
    b = format_size
    calls = [f"{k} {v}" for k, v in s.driver_calls().items() if v] or ["none"]
    lines = _lines("", [f"Stats: capacity {b(s.capacity_bytes)}", f"pages of {b(s.page_bytes)} ({s.pages_total} held",
                        f"{s.pages_mapped} mapped", f"{s.pages_free} unmapped)"])
    lines += _lines("memory", [f"allocated {b(s.allocated_bytes)} (peak {b(s.peak_allocated_bytes)})",
                               f"active {b(s.active_bytes)}", f"mapped {b(s.mapped_bytes)} (peak {b(s.peak_mapped_bytes)})",
                               f"cached {b(s.cached_bytes)}", f"pending free {b(s.pending_free_bytes)}"])
    lines += _lines("counts", [f"{s.num_live_allocs} live", f"{s.num_allocs} allocations", f"{s.num_frees} frees",
                               f"{s.num_ooms} OOMs", f"{s.num_page_reclaims} page reclaims",
                               f"fragmentation {100 * s.fragmentation:.1f}%"])
    lines += _lines("eviction", [f"{s.evict_mode} mode", f"{s.pages_evicted} pages evicted ({b(s.evicted_bytes)})",
                                 f"{s.evictions} evictions", f"{s.restores} restores",
                                 f"host pool {b(s.host_pool_used_bytes)} used"])
    lines += _lines("driver", calls)
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class RegionStats:
    """One region of an address space (docs/regions.md): the allocations made under one tag, what
    of them is paused, and what its pauses and resumes did. Bytes are rounded allocation bytes
    unless they say pages."""

    tag: str
    allocations: int           # live allocations carrying the tag (graph pools' kept blocks included)
    bytes: int                 # their bytes
    paused_bytes: int          # of those, bytes on paused pages: off the device
    discarded_bytes: int       # of the paused bytes, those paused with discard=True (no copy kept)
    paused_page_bytes: int     # device page bytes the paused pages no longer hold
    host_bytes: int            # host pool bytes holding the paused pages' copies
    pauses: int                # pauses that took pages off the device
    resumes: int               # resumes that brought pages back
    bytes_paused_total: int    # device page bytes all pauses took off the device
    bytes_resumed_total: int   # device page bytes all resumes brought back
    pause_ns_total: int        # time spent in pauses (copies and waits included)
    resume_ns_total: int       # time spent in resumes

    @property
    def paused(self) -> bool:
        """Some of the region's bytes are paused."""
        return self.paused_bytes > 0
