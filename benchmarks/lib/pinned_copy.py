"""Pinned host <-> device copies through torch, timed: the physical reference an eviction or a
restore is measured against.

Owns: :func:`pinned_copy_times` (``bench_evict.py``'s reference row, ``probe_restore_overhead.py``'s
fits). Invariants: one untimed copy per direction first; each timed copy is synchronized alone and
timed twice, by CUDA events (the device's time) and by the wall clock around the call.
"""

from __future__ import annotations

import time

__all__ = ["pinned_copy_times"]


def pinned_copy_times(size: int, repeats: int) -> dict[str, dict[str, list[float]]]:
    """``{"h2d" | "d2h": {"event_s": [...], "wall_s": [...]}}`` for ``repeats`` copies of ``size``
    bytes between a pinned host buffer and a device buffer."""
    import torch

    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    out: dict[str, dict[str, list[float]]] = {}
    for name, (dst, src) in {"h2d": (dev, host), "d2h": (host, dev)}.items():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        events, walls = [], []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            walls.append(time.perf_counter() - t0)
            events.append(start.elapsed_time(end) / 1e3)
        out[name] = {"event_s": events, "wall_s": walls}
    return out
