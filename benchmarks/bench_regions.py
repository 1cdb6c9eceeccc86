"""bench_regions: pause and resume of a tagged region (docs/regions.md): rates and driver calls per GiB.

Each row allocates a region under a tag, fills it, then times ``pause(tag)`` and ``resume(tag)``
over --repeats cycles and counts the driver calls each made, per GiB moved (the space's call
counters): the first cycle (on the handles the allocations got) apart from the median of the later
ones (a resume maps the region's stretches of pages on extents). Two layouts: ``one`` (one allocation of --size bytes) and ``model`` (a model's
weights of about --size bytes, allocated back to back as a model loads: per layer four d x d and
two d x 4d bf16 matrices and two norm vectors of d, d = 4096). A ``discard`` row pauses the one
allocation with discard=True (no copy).

- ``--backend host``: the wall clock of memcpy on this CPU (it says nothing about a GPU) and the
  driver calls, which are the ones a GPU would get.
- ``--backend host --cost-model h100``: the modeled clock (docs/cost-model.md): a **prediction** of
  an H100, beside the pinned copy rates the model itself charges (its table's largest row), so the
  predicted share of pinned is the model's own.
- ``--backend cuda``: the wall clock on the GPU, beside pinned cudaMemcpy of --size bytes through torch.

Every row checks that it measured the path it names (benchmarks/lib/path_check.py): the pause moved the
region's pages off the device and held their bytes on the host (none with discard), the resume
brought every page back, the bytes compared equal. Writes
benchmarks/results/regions-<backend>[-<model>-model]-<date>.json.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_evict import reference_copy
from lib.path_check import PathNotTaken, check, failed, summary
from lib.provenance import git_info, machine_info
from vtalloc.allocator import AddressSpace, backend_available

MiB = 1 << 20
GiB = 1 << 30
D = 4096  # the model layout's width
CALLS = ("num_copy_calls", "num_map_calls", "num_unmap_calls", "num_set_access_calls", "num_create_page_calls",
         "num_release_page_calls", "num_event_record_calls", "num_event_synchronize_calls",
         "num_stream_synchronize_calls", "num_stream_wait_event_calls")
# The pinned copy rates the h100 cost model charges for its largest copies (docs/cost-model.md,
# "The figures and their source": 256 MiB per copy, H100 80GB HBM3, 2026-11-22), GB/s.
MODEL_PINNED_GBPS = {"h100": {"d2h": 55.1, "h2d": 54.8}}


def provenance() -> dict[str, Any]:
    return {"machine": machine_info(), "git": git_info(), "date": _dt.date.today().isoformat(),
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])}


def layout_sizes(layout: str, size: int) -> list[int]:
    """The allocations of a region of about ``size`` bytes, in the order a model would make them."""
    if layout == "one":
        return [size]
    layer = [D * D * 2] * 4 + [D * 4 * D * 2] * 2 + [D * 2] * 2
    sizes: list[int] = []
    while sum(sizes) + sum(layer) <= size or not sizes:
        sizes += layer
    return sizes


def region_check(layout: str, discard: bool, total: int, measured: dict[str, Any]) -> dict[str, Any]:
    """Did the row pause and resume the region? Every byte of it paused, its pages off the device (the
    space held none while paused, nothing else being allocated), their bytes on the host (none with
    discard), every page brought back, nothing left paused, the bytes equal (not compared with discard)."""
    page_bytes = measured.get("paused_page_bytes")
    expected = {"paused_bytes": -(-total // 512) * 512 if layout == "one" else {"min": total},
                "host_bytes": 0 if discard else page_bytes, "pages_held_while_paused": 0,
                "resumed_page_bytes": page_bytes, "paused_bytes_after_resume": 0, "bytes_intact": True}
    row = f"regions {layout}{' discard' if discard else ''} {total // MiB} MiB"
    return check(row, "pause then resume of a tagged region", expected, measured)


def calls_per_gib(before: Any, after: Any, nbytes: int) -> dict[str, float]:
    return {k: round((getattr(after, k) - getattr(before, k)) / (nbytes / GiB), 2) for k in CALLS}


def clock_of(space: AddressSpace, backend: str):
    """Seconds by the modeled clock (a cost model) or the wall clock."""
    if space.modeled_ns() is not None:
        return lambda: space.modeled_ns() / 1e9
    return time.perf_counter


def region_row(backend: str, layout: str, size: int, repeats: int, cost_model: str | None,
               discard: bool = False) -> dict[str, Any]:
    sizes = layout_sizes(layout, size)
    total = sum(sizes)
    kw: dict[str, Any] = {"cost_model": cost_model} if cost_model else {}
    capacity = total + 64 * MiB
    with AddressSpace(backend=backend, capacity=capacity, host_capacity=capacity, **kw) as space:
        with space.region("bench"):
            addrs = [space.malloc(n) for n in sizes]
        chunk = os.urandom(MiB)
        for a, n in zip(addrs, sizes):
            space.write(a, (chunk * (n // MiB + 1))[:n])
        first = space.read(addrs[0], min(sizes[0], MiB))
        clock = clock_of(space, backend)
        pause_s, resume_s, pause_calls, resume_calls, checks_in = [], [], [], [], {}
        for i in range(repeats):
            s0 = space.stats()
            t0 = clock()
            paused_page_bytes = space.pause("bench", discard=discard)
            pause_s.append(clock() - t0)
            s1 = space.stats()
            r = space.region_stats("bench")
            t0 = clock()
            resumed_page_bytes = space.resume("bench")
            resume_s.append(clock() - t0)
            s2 = space.stats()
            pause_calls.append(calls_per_gib(s0, s1, paused_page_bytes))
            resume_calls.append(calls_per_gib(s1, s2, resumed_page_bytes))
            if i == 0:
                checks_in = {"paused_bytes": r.paused_bytes, "host_bytes": r.host_bytes,
                             "pages_held_while_paused": s1.pages_total,
                             "resumed_page_bytes": resumed_page_bytes, "paused_page_bytes": paused_page_bytes,
                             "paused_bytes_after_resume": space.region_stats("bench").paused_bytes,
                             "bytes_intact": discard or space.read(addrs[0], len(first)) == first}
        for a in addrs:
            space.free(a)
    page_bytes = checks_in["paused_page_bytes"]
    # The first cycle pauses the handles the allocations got; its resume maps the region's stretches on
    # extents, so the later cycles (the steady state of a loop that pauses every step) move those.
    later = slice(1, None) if repeats > 1 else slice(0, None)
    med_p, med_r = statistics.median(pause_s[later]), statistics.median(resume_s[later])

    def rate(seconds: float) -> float | None:
        return round(page_bytes / seconds / 1e9, 3) if seconds else None

    out = {
        "layout": layout, "discard": discard, "allocations": len(sizes), "region_bytes": total,
        "page_bytes_moved": page_bytes, "pause_s": pause_s, "resume_s": resume_s,
        "first_pause_GBps": rate(pause_s[0]), "first_resume_GBps": rate(resume_s[0]),
        "first_pause_calls_per_GiB": pause_calls[0], "first_resume_calls_per_GiB": resume_calls[0],
        "pause_GBps": rate(med_p), "resume_GBps": rate(med_r),  # the cycles after the first
        "pause_calls_per_GiB": pause_calls[-1], "resume_calls_per_GiB": resume_calls[-1],
        "path_check": region_check(layout, discard, total, checks_in),
    }
    if cost_model:
        pinned = MODEL_PINNED_GBPS[cost_model]
        out["predicted"] = True
        if not discard:
            for when in ("first_", ""):
                out[f"{when}pause_share_of_model_pinned"] = round(out[f"{when}pause_GBps"] / pinned["d2h"], 3)
                out[f"{when}resume_share_of_model_pinned"] = round(out[f"{when}resume_GBps"] / pinned["h2d"], 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="host", choices=["host", "cuda"])
    ap.add_argument("--cost-model", choices=sorted(MODEL_PINNED_GBPS), default=None,
                    help="host backend only: predict the GPU's rates with the driver cost model's modeled clock")
    ap.add_argument("--size", action="append", type=int, default=None,
                    help="region bytes (repeat for several; default 512 MiB and 1 GiB, cuda: 16 GiB)")
    ap.add_argument("--repeats", default=3, type=int)
    ap.add_argument("--quick", action="store_true", help="one 64 MiB size, two cycles")
    ap.add_argument("--out", default="benchmarks/results/regions-{backend}-{date}.json")
    ap.add_argument("--note", action="append", default=[])
    args = ap.parse_args()
    if args.cost_model and args.backend != "host":
        ap.error("--cost-model runs on the host backend (--backend host)")
    if args.backend == "cuda":
        ok, why = backend_available("cuda")
        if not ok:
            print(f"cuda: not available here: {why}")
            sys.exit(0)
    sizes = [64 * MiB] if args.quick else args.size or ([16 * GiB] if args.backend == "cuda" else [512 * MiB, GiB])
    repeats = 2 if args.quick else args.repeats
    rows = []
    for size in sizes:
        for layout in ("one", "model"):
            rows.append(region_row(args.backend, layout, size, repeats, args.cost_model))
        rows.append(region_row(args.backend, "one", size, repeats, args.cost_model, discard=True))
    record: dict[str, Any] = {"benchmark": "regions" + ("-predicted" if args.cost_model else ""),
                              "backend": args.backend, "cost_model": args.cost_model, "provenance": provenance(),
                              "notes": args.note, "rows": rows}
    if args.cost_model:
        record["model_pinned_GBps"] = MODEL_PINNED_GBPS[args.cost_model]
    if args.backend == "cuda":
        record["reference"] = reference_copy("cuda", min(max(sizes), 2 * GiB), repeats)  # pinned cudaMemcpy
    checks = [r["path_check"] for r in rows]
    record["path_checked"] = summary(checks)
    name = f"{args.backend}-{args.cost_model}-model" if args.cost_model else args.backend
    out = Path(args.out.format(backend=name, date=_dt.date.today().isoformat()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    label = "predicted on an H100 (cost model)" if args.cost_model else f"measured ({args.backend})"
    print(f"regions: pause / resume, {label}; the first cycle, then the median of the {max(repeats - 1, 1)} after it")
    for r in rows:
        for when, name in (("first_", "first"), ("", "later")):
            share = (f" ({100 * r[when + 'pause_share_of_model_pinned']:.1f}% / "
                     f"{100 * r[when + 'resume_share_of_model_pinned']:.1f}% of the model's pinned)"
                     if when + "pause_share_of_model_pinned" in r else "")
            pc, rc = r[when + "pause_calls_per_GiB"], r[when + "resume_calls_per_GiB"]
            print(f"  {r['layout']:5s}{' discard' if r['discard'] else '':8s} {r['region_bytes'] / MiB:6.0f} MiB "
                  f"({r['allocations']:3d} allocs) {name:5s}: pause {r[when + 'pause_GBps']:8.2f} GB/s, resume "
                  f"{r[when + 'resume_GBps']:8.2f} GB/s{share}; per GiB: pause copy {pc['num_copy_calls']:g} "
                  f"unmap {pc['num_unmap_calls']:g} release {pc['num_release_page_calls']:g}, resume copy "
                  f"{rc['num_copy_calls']:g} map {rc['num_map_calls']:g} access {rc['num_set_access_calls']:g} "
                  f"create {rc['num_create_page_calls']:g}")
    if "reference" in record:
        ref = record["reference"]
        print(f"  reference ({ref['what']}): h2d {ref['h2d']['GBps']:.2f} GB/s, d2h {ref['d2h']['GBps']:.2f} GB/s")
    print(f"wrote {out}")
    if failed(checks):
        raise PathNotTaken("bench_regions: rows measured another path than they name:\n  " + "\n  ".join(failed(checks)))


if __name__ == "__main__":
    main()
