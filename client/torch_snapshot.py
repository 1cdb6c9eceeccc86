"""The daemon's page map (``vtalloc pages``) in PyTorch's snapshot format (``--format torch``).

Owns: ``pages_snapshot(doc)``: a ``vtalloc.pages/v1`` document turned into the dict
``torch.cuda.memory._snapshot()`` returns, for ``torch.cuda._memory_viz``.
Invariants: the daemon knows pages, not the clients' allocations, so a segment is a run of
consecutive page ids one session holds, at address ``page_id * page_bytes`` (the page's place
in the node's pool, not a virtual address), and each page is one block: ``active_allocated``
when the client last reported it resident (under live allocations), else ``inactive``. Each
segment names its session (``vtalloc_session``), which _memory_viz ignores.
"""

from __future__ import annotations

from typing import Any

from vtalloc.allocator.memory_snapshot import block, segment

__all__ = ["pages_snapshot"]


def pages_snapshot(doc: dict[str, Any]) -> dict[str, Any]:
    device = doc["devices"][0]
    page, ordinal = device["page_bytes"], device["device"]
    by_session: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(doc["pages"], key=lambda p: p["page_id"]):
        by_session.setdefault(p["session_id"], []).append(p)
    segments = []
    for session_id, pages in by_session.items():
        start = 0
        for k in range(1, len(pages) + 1):
            if k < len(pages) and pages[k]["page_id"] == pages[k - 1]["page_id"] + 1:
                continue  # the run goes on
            run, start = pages[start:k], k
            blocks = [block(q["page_id"] * page, page, page if q["use"] == "resident" else None) for q in run]
            segments.append(segment(run[0]["page_id"] * page, blocks, ordinal, vtalloc_session=session_id))
    return {"segments": segments, "device_traces": [[] for _ in range(ordinal + 1)],
            "vtalloc": {"page_bytes": page, "source": "daemon page map", "hidden_pages": doc["hidden_pages"]}}
