"""A space's memory in PyTorch's snapshot format, for PyTorch's memory tools.

Owns: building the dict ``torch.cuda.memory._snapshot()`` returns ("segments" with their
"blocks", "device_traces") from vtalloc's records: :func:`space_snapshot` for an address
space (``AddressSpace.memory_snapshot()``), and :func:`segment` / :func:`block`, which the
page map of the daemon (``vtalloc pages --format torch``) is built from too.
Invariants: imports nothing of torch. A segment is a run of virtual address space backed by
pages (mapped, cached, evicted or in flight), so it is what torch calls reserved; its blocks
tile it exactly (``active_allocated`` for a live allocation, ``inactive`` for the rest), as
``torch.cuda._memory_viz stats`` checks. Pages held but unmapped have no address and appear
only in the top-level ``"vtalloc"`` summary. ``device_traces`` holds the space's recorded
history (allocator/history.py, ``AddressSpace.record_history()``) at the space's device, and a
live block recorded there carries its stack in ``frames``; without recording they are empty,
so timelines start at the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .history import History
from .stats import AllocationRecord, PageRecord

__all__ = ["space_snapshot", "segment", "block"]


def block(address: int, size: int, requested: int | None = None) -> dict[str, Any]:
    """A live allocation (``requested`` bytes asked, ``size`` after rounding), or, with
    ``requested=None``, a free stretch of a segment."""
    if requested is None:
        return {"address": address, "size": size, "requested_size": 0, "state": "inactive", "frames": []}
    return {"address": address, "size": size, "requested_size": requested, "state": "active_allocated", "frames": []}


def segment(address: int, blocks: list[dict[str, Any]], device: int, **extra: Any) -> dict[str, Any]:
    """A segment made of ``blocks`` (contiguous from ``address``), with the totals torch keeps."""
    total = sum(b["size"] for b in blocks)
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": device, "address": address, "total_size": total, "allocated_size": active,
            "active_size": active, "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": True, "frames": [],
            "blocks": blocks, **extra}


def _ranges(allocations: Sequence[AllocationRecord], pages: Iterable[PageRecord], page_bytes: int) -> list[list[int]]:
    """Merged [start, end) runs of whole pages under the pages with an address and the allocations."""
    spans = [(p.address, p.address + page_bytes) for p in pages if p.address is not None]
    spans += [(a.address - a.address % page_bytes, -(-(a.address + a.size_bytes) // page_bytes) * page_bytes)
              for a in allocations if a.size_bytes]
    runs: list[list[int]] = []
    for start, end in sorted(spans):
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return runs


def space_snapshot(allocations: Sequence[AllocationRecord], pages: Sequence[PageRecord], page_bytes: int,
                   device: int, history: History | None = None) -> dict[str, Any]:
    """The snapshot of one address space (see the module's docstring)."""
    live = sorted((a for a in allocations if a.size_bytes), key=lambda a: a.address)
    segments, i = [], 0
    for start, end in _ranges(live, pages, page_bytes):
        blocks, cursor = [], start
        while i < len(live) and live[i].address < end:
            a = live[i]
            i += 1
            if a.address > cursor:
                blocks.append(block(cursor, a.address - cursor))
            blocks.append(block(a.address, a.size_bytes, min(a.requested_bytes, a.size_bytes)))
            if history is not None:
                blocks[-1]["frames"] = history.frames_of(a.address)
            cursor = a.address + a.size_bytes
        if cursor < end:
            blocks.append(block(cursor, end - cursor))
        segments.append(segment(start, blocks, device))
    by_state: dict[str, int] = {}
    for p in pages:
        by_state[p.state] = by_state.get(p.state, 0) + 1
    traces: list[list[dict[str, Any]]] = [[] for _ in range(device + 1)]
    if history is not None:
        traces[device] = history.trace()
    return {"segments": segments, "device_traces": traces,
            "vtalloc": {"page_bytes": page_bytes, "pages_by_state": by_state}}
