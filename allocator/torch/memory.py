"""The torch allocator's statistics and maintenance under PyTorch's function names.

Owns: ``stats`` / ``memory_stats`` and the rest of ``torch.cuda``'s memory functions
(``memory_allocated`` ... ``mem_get_info``, ``memory_summary``, ``empty_cache``), and the view
of the spaces serving torch that ``vtalloc stats --pid`` reads (``publish_stats``). The keys
and the ``device`` argument are ``stat_keys``'s; what the allocator could not do and how an
out-of-memory reaches Python are ``failure_reports``'s.
Invariants: never imports torch at import, and never initializes CUDA; reading changes
nothing (the resets say what they restart); every function works before the first allocation
(all zero).
"""

from __future__ import annotations

import sys
from typing import Any

from ..config import format_size
from ..publish import publish_stats as _publish
from ..stats import Stats
from . import shim as _torch_shim
from . import stat_keys as _stats
from .process_mode import describe as _describe
from .process_mode import state as _state

__all__ = [
    "stats", "memory_stats", "memory_stats_as_nested_dict", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_accumulated_memory_stats", "mem_get_info", "memory_summary", "empty_cache", "publish_stats", "TORCH_VIEW",
]


# -- statistics ----------------------------------------------------------------------------
# ``device`` of the PyTorch-named functions is read as torch.cuda reads it: an ordinal, "cuda",
# "cuda:N", a torch.device, or None for the current device (torch.cuda.current_device(), 0
# before CUDA is initialized; it is never initialized here). vtalloc adds "all": every device
# the allocator serves, summed (peaks: the sum of per-device peaks).

def stats(device: Any = _stats.ALL) -> Stats:
    """vtalloc's Stats of the torch allocator: summed over every device it serves ("all", the
    default), or one device (an ordinal, "cuda:N", a torch.device; None: the current one).

    Summed peaks are the sum of each device's peak. page_bytes and small_threshold_bytes are
    per-device settings: the largest is reported. All zero before the first allocation.
    """
    return _stats.sum_stats([_torch_shim.device_stats(d) for d in _stats.device_list(device)])


def memory_stats(device: Any = None) -> dict[str, int]:
    """Statistics under torch.cuda.memory_stats() key names where the meaning is the same.

    - ``allocated_bytes.all.{current,peak}``: live allocations as the allocator rounded them
      (whole 512 B blocks): vtalloc's active bytes;
    - ``requested_bytes.all.{current,peak}``: live allocations as requested;
    - ``active_bytes.all.current``: allocated plus freed memory still waiting for its stream;
    - ``reserved_bytes.all.{current,peak}``: physical pages held (mapped or not);
    - ``allocation.all.{current,allocated,freed}``, ``num_ooms``, ``num_device_alloc`` /
      ``num_device_free`` (page map / unmap calls).
    Keys that start with ``vtalloc.`` have no PyTorch counterpart. ``device``: as torch's (None:
    the current device), or "all" (summed over devices; peaks: the sum of per-device peaks).
    """
    return _stats.flat_stats(_stats.device_list(device))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """:func:`memory_stats` as nested dicts (``["allocated_bytes"]["all"]["peak"]``), as torch's."""
    return _stats.nested(memory_stats(device))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    """The most bytes of physical pages held at once since the start or the last peak reset."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def _peak_device(device: Any) -> int | None:
    return None if isinstance(device, str) and device == _stats.ALL else _stats.device_index(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Peaks (allocated, requested, reserved, mapped) restart from the current values."""
    _torch_shim.reset_peak_stats(_peak_device(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    """As torch's: resets *every* peak (it calls :func:`reset_peak_memory_stats`). Unlike torch,
    it emits no FutureWarning: vtalloc has no older behaviour to warn about."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Restart the accumulated counts from zero: ``allocation.all.allocated`` / ``freed``,
    ``num_ooms``, ``num_device_alloc`` / ``free`` and vtalloc's historical counters (page
    reclaims, failures), as memory_stats() reports them. :func:`stats` and
    :func:`~vtalloc.allocator.torch.failure_reports.failures` keep the allocator's own counts."""
    for d in _stats.device_list(device):
        _stats.reset_accumulated(d)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes as the vtalloc allocator sees the device: total is the capacity of its
    address space there, free what it may still take (capacity less the pages it holds), no more
    than the driver's free memory once CUDA is initialized. Before the device's space exists:
    the configured capacity, or, with none configured, the driver's answer
    (torch.cuda.mem_get_info) where CUDA is initialized, else (0, 0).

    torch.cuda.mem_get_info() stays the driver's view of the whole GPU (every process)."""
    d = _stats.device_index(device)
    s = _torch_shim.device_stats(d)
    torch = sys.modules.get("torch")
    driver = torch.cuda.mem_get_info(d) if torch is not None and torch.cuda.is_initialized() else None
    if s.capacity_bytes:
        total = s.capacity_bytes
        free = total - s.pages_total * s.page_bytes
    else:
        is_configured, _, options = _torch_shim.current_config()
        configured = options["capacity_bytes"] if is_configured else 0
        if not configured:
            return (int(driver[0]), int(driver[1])) if driver else (0, 0)
        free = total = configured
    return (min(free, int(driver[0])) if driver else free), total


def empty_cache(device: Any = _stats.ALL) -> int:
    """Unmap cached pages and give unused pages back to the driver; returns the bytes released.

    ``torch.cuda.empty_cache()`` does nothing under a pluggable allocator: call this instead.
    Like it, by default it covers every device ("all"); a ``device`` argument narrows it to one.
    """
    return _torch_shim.trim(_peak_device(device))


def memory_summary(device: Any = _stats.ALL) -> str:
    """A human-readable table of the torch allocator's memory: by default of every device it
    serves and their total ("all"), or of the one ``device`` names (None: the current one)."""
    devs = _stats.device_list(device)
    header = f"vtalloc torch allocator ({_state.mode or 'not enabled'}" + (
        f"; {_describe(_state.config)})" if _state.config else ")")
    if not devs:
        return header + "\nno device has allocated through vtalloc yet\n"
    rows = [("metric", *[f"cuda:{d}" for d in devs])]
    if len(devs) > 1:
        rows[0] = (*rows[0], "total")
    per = [memory_stats(d) for d in devs]
    total = memory_stats(_stats.ALL) if len(devs) > 1 else None
    metrics = [
        ("allocated (rounded)", "allocated_bytes.all.current", True),
        ("allocated, peak", "allocated_bytes.all.peak", True),
        ("requested", "requested_bytes.all.current", True),
        ("reserved (pages held)", "reserved_bytes.all.current", True),
        ("mapped", "vtalloc.mapped_bytes.current", True),
        ("mapped, peak", "vtalloc.mapped_bytes.peak", True),
        ("cached (mapped, free)", "vtalloc.cached_bytes.current", True),
        ("waiting for streams", "vtalloc.pending_free_bytes.current", True),
        ("capacity", "vtalloc.capacity_bytes", True),
        ("page size", "vtalloc.page_bytes", True),
        ("live allocations", "allocation.all.current", False),
        ("allocations / frees", None, False),
        ("page reclaims", "vtalloc.num_page_reclaims", False),
        ("OOMs", "num_ooms", False),
        ("alloc failures", "vtalloc.alloc_failures", False),
        ("free failures", "vtalloc.free_failures", False),
    ]
    for label, key, is_bytes in metrics:
        cells = []
        for m in per + ([total] if total else []):
            if key is None:
                cells.append(f"{m['allocation.all.allocated']} / {m['allocation.all.freed']}")
            else:
                cells.append(format_size(m[key]) if is_bytes else str(m[key]))
        if total and label == "page size":
            cells[-1] = ""
        rows.append((label, *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [header]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


class _TorchSpacesView:
    """What the stats publisher sees of the spaces serving torch: their Stats summed over devices."""

    backend, device, closed, leased, name = "cuda", _torch_shim.ALL_DEVICES, False, False, "torch"

    def stats(self) -> Stats:
        return stats()

    def published_parts(self) -> list[tuple[str, int, Stats]]:
        """One row per device with a space, named as torch names the device (``torch:cuda:0``)."""
        return [(f"torch:cuda:{d}", d, _torch_shim.device_stats(d)) for d in _torch_shim.devices()]


TORCH_VIEW = _TorchSpacesView()  # module-lifetime: the publisher holds it by weak reference


def publish_stats(interval_s: float = 1.0) -> None:
    """Publish the torch allocator's stats for ``vtalloc stats --pid`` (as VTALLOC_PUBLISH_STATS=1
    does at enable()/mempool())."""
    _publish(TORCH_VIEW, name="torch", interval_s=interval_s)

