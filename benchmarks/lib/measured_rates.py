"""The GPU eviction and restore rates each driver cost model is checked against.

Owns: :func:`measured_rows` (per cost model, the configurations measured on that GPU, with the
figures), :func:`fitted_to` (which of those figures a fitted parameter of the model was solved
for: its prediction is not independent of the measurement), :func:`pinned_gbps` (the pinned
copy a rate is a percentage of) and :func:`measured_source`. Invariants: the H200 rows are read
from the raw JSON in ``benchmarks/results/`` (nothing retyped); the H100 rows are history from
before raw JSON was kept (BENCHMARKS.md "History, not reproducible"). A row's ``page`` is None at
default settings (2 MiB pages, extents on), else the page and extent size of the run.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import NamedTuple

__all__ = ["MeasuredRow", "fitted_to", "measured_rows", "measured_source", "pinned_gbps"]

MiB = 1 << 20
RESULTS = Path(__file__).resolve().parent.parent / "results"


class MeasuredRow(NamedTuple):
    size: int  # bytes of the one allocation evicted and restored
    page: int | None  # page (= extent) bytes; None: default settings
    mode: str  # evict_mode: "copy" or "mapped"
    evict_gbps: float
    restore_gbps: float
    run: str  # which run of the source


# Measured on an H100 (80GB HBM3), 2026-11-22, with `bench_evict.py --backend cuda` (run 1: 256 MiB
# and 1 GiB; run 2: 1 GiB, median of 4 cycles in one process), one handle per page, before extents.
_H100 = (
    MeasuredRow(256 * MiB, 2 * MiB, "mapped", 16.8, 15.5, "1"),
    MeasuredRow(256 * MiB, 2 * MiB, "copy", 33.3, 46.2, "1"),
    MeasuredRow(1024 * MiB, 2 * MiB, "copy", 30.5, 42.1, "1"),
    MeasuredRow(1024 * MiB, 32 * MiB, "copy", 52.0, 53.9, "1"),
    MeasuredRow(1024 * MiB, 2 * MiB, "mapped", 15.8, 13.9, "2"),
    MeasuredRow(1024 * MiB, 32 * MiB, "mapped", 34.4, 53.7, "2"),
    MeasuredRow(1024 * MiB, 64 * MiB, "mapped", 37.1, 53.9, "2"),
    MeasuredRow(1024 * MiB, 2 * MiB, "copy", 34.2, 49.6, "2"),
    MeasuredRow(1024 * MiB, 32 * MiB, "copy", 51.9, 54.2, "2"),
    MeasuredRow(1024 * MiB, 64 * MiB, "copy", 53.2, 54.3, "2"),
)
_H100_FITTED = {
    (1024 * MiB, 32 * MiB, "mapped", "evict"): "d2h_to_host_page_factor",
    (256 * MiB, 2 * MiB, "mapped", "restore"): "host_page_unmap_extra_us",
    (1024 * MiB, 2 * MiB, "mapped", "restore"): "host_page_unmap_extra_us",
}

# The H200 runs of benchmarks/probe_restore_overhead.py, 2026-11-28 (BENCHMARKS.md "GPU figures
# (H200, 2026-11-28)"): default settings, 8/32/128/512 MiB, median of 5 cycles. Run 2 also timed
# the VMM calls the model's table holds (kH200 in csrc/backend/testing/cost_model.cpp).
_H200_RUNS = {"1": "restore_overhead-cuda-2026-11-28-run1.json", "2": "restore_overhead-cuda-2026-11-28-run2.json"}
_H200_FITTED = {
    (512 * MiB, None, "mapped", "evict", "2"): "d2h_to_host_page_factor",
    (512 * MiB, None, "mapped", "restore", "2"): "h2d_from_host_page_factor",
}


@functools.cache
def _result(name: str) -> dict:
    """A raw JSON of benchmarks/results/, read once per process."""
    return json.loads((RESULTS / name).read_text())


def _h200_rows() -> tuple[MeasuredRow, ...]:
    rows = []
    for run, name in _H200_RUNS.items():
        for r in _result(name)["rows"]:
            if r["mode"] != r["active_mode"]:
                continue  # "auto" measured copy mode again under another name
            rows.append(MeasuredRow(r["size_bytes"], None, r["mode"], r["evict_GBps"], r["restore_GBps"], run))
    return tuple(rows)


def measured_rows(cost_model: str) -> tuple[MeasuredRow, ...]:
    return {"h100": lambda: _H100, "h200": _h200_rows}[cost_model]()


def fitted_to(cost_model: str, row: MeasuredRow, what: str) -> str | None:
    """The fitted parameter of `cost_model` solved for this row's `what` ("evict"/"restore"), or None."""
    if cost_model == "h100":
        return _H100_FITTED.get((row.size, row.page, row.mode, what))
    return _H200_FITTED.get((row.size, row.page, row.mode, what, row.run))


def measured_source(cost_model: str) -> str:
    return {"h100": "measured on an H100 (80GB HBM3), 2026-11-22, bench_evict.py --backend cuda",
            "h200": "measured on an H200 (143,771 MiB), 2026-11-28, probe_restore_overhead.py --repeats 5: "
                    + ", ".join(f"run {k} benchmarks/results/{v}" for k, v in _H200_RUNS.items())}[cost_model]


def pinned_gbps(cost_model: str) -> dict[str, float]:
    """The pinned copy a rate is a percentage of, per direction ("d2h" for eviction, "h2d" for restore)."""
    if cost_model == "h100":
        return {"d2h": 54.9, "h2d": 54.9}  # pinned cudaMemcpy, 256 MiB, 2026-11-22
    ref = _result(_H200_RUNS["2"])["reference"][str(32 * MiB)]
    return {"d2h": ref["d2h"]["event_GBps"], "h2d": ref["h2d"]["event_GBps"]}  # 32 MiB, by CUDA events
