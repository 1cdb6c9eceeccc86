"""probe_copy_paths: copy bandwidth between a device VMM page and every kind of host memory
vtalloc could evict into, on the raw CUDA driver (issue 10: why mapped-mode eviction ran at
63-68% of a pinned copy on an H100 while its restore ran at 98%). docs/cost-model.md, "The open
question: mapped-mode eviction", says what each outcome means for the engine.

Owns: the probe's plan (targets x methods x streams x sizes x directions), its JSON, table and
VERDICT, and the pure logic the CPU tests call: parse_sizes(), split_plan(), pct(), with_pct(),
verdict(), estimate_s(); and the mapping-call timings (mapping_calls(): what creating, mapping,
granting access to, unmapping and releasing one handle costs, device and host-located, by
size), which the 2026-11-26 verdict made the next question. The driver work is in
lib/probe_copy_driver.py.
Invariants: nothing of vtalloc's library is used (the probe measures the driver); a refusal of
the driver is a recorded result, never a crash; without cuda-python, a CUDA driver or a device
it prints one line on stderr and exits 2; the pinned memcpy_async 1-stream row of the same
direction and size is the 100% of every row.

Run from the repository root:  python benchmarks/probe_copy_paths.py [--quick] [--with-compute]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lib.probe_copy_driver import MatmulLoad, Missing, Probe, Refused, load_driver

MiB = 1 << 20
TARGETS = ("pinned", "host_numa", "host", "host_numa_current", "host_numa_cpu")
METHODS = ("memcpy_async", "batch", "batch_ce")
STREAMS = (1, 2, 4)
DIRECTIONS = ("evict", "restore")  # evict: device page -> target (D2H); restore: target -> device page
DEFAULT_SIZES = (2 * MiB, 32 * MiB, 256 * MiB)
REFERENCE = ("pinned", "memcpy_async", 1)  # what a pinned cudaMemcpy does: the 100% of every row
THRESHOLD = 90.0                           # issue 10: >= 90% of pinned, both modes
JUDGED_FROM = 32 * MiB                     # issue 10's bar is for allocations of 32 MiB and more
ASSUMED_SLOW_GBPS = 10.0                   # the run-time estimate assumes every path this slow


# -- pure logic (tests/test_probe_copy_paths.py) ---------------------------------------------
def parse_sizes(text: str) -> tuple[int, ...]:
    """'2MiB,32MiB' -> byte counts; units B, KiB, MiB, GiB (or none: bytes)."""
    units = {"": 1, "b": 1, "kib": 1 << 10, "mib": MiB, "gib": 1 << 30}
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", part)
        if not m or m.group(2).lower() not in units or int(m.group(1)) == 0:
            raise argparse.ArgumentTypeError(f"not a size: {part!r} (e.g. 32MiB)")
        out.append(int(m.group(1)) * units[m.group(2).lower()])
    if not out:
        raise argparse.ArgumentTypeError("no size given")
    return tuple(out)


def split_plan(nbytes: int, parts: int, align: int = 4096) -> list[tuple[int, int]]:
    """Contiguous (offset, length) pieces, one per stream, covering [0, nbytes) once; piece
    boundaries on `align` (the last piece takes the remainder), so fewer pieces when small."""
    if nbytes <= 0 or parts < 1 or align < 1:
        raise ValueError(f"split_plan({nbytes}, {parts}, {align}): need nbytes > 0, parts >= 1, align >= 1")
    chunk = -(-(-(-nbytes // parts)) // align) * align
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def pct(rate: float | None, reference: float | None) -> float | None:
    """rate as a % of reference, one decimal; None where either is missing or the reference is 0."""
    if rate is None or not reference:
        return None
    return round(100.0 * rate / reference, 1)


def _path(r: dict[str, Any]) -> tuple[str, str, int]:
    return r["target"], r["method"], r["streams"]


def _references(rows: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    return {(r["direction"], r["size_bytes"]): r["gbps"] for r in rows
            if r.get("status") == "ok" and r.get("load", "idle") == "idle" and _path(r) == REFERENCE and r["gbps"]}


def with_pct(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each measured row with pct_of_pinned: against the idle pinned memcpy_async 1-stream row of
    its direction and size (rows under load too: the drop shows)."""
    refs = _references(rows)
    return [{**r, "pct_of_pinned": pct(r["gbps"], refs.get((r["direction"], r["size_bytes"])))}
            if r.get("status") == "ok" else r for r in rows]


def verdict(rows: list[dict[str, Any]], threshold: float = THRESHOLD, judged_from: int = JUDGED_FROM) -> dict[str, Any]:
    """Per direction, the best non-pinned path (target, method, streams), idle rows only. A path
    is judged by its lowest % of pinned over the judged sizes (those >= judged_from that have a
    pinned reference, or all of them if none is that large); a path missing a judged size (refused
    or not run there) is not a candidate. Refused rows are skipped."""
    refs = _references(rows)
    out: dict[str, Any] = {}
    for direction in DIRECTIONS:
        sizes = sorted(s for d, s in refs if d == direction)
        judged = [s for s in sizes if s >= judged_from] or sizes
        per_path: dict[tuple[str, str, int], dict[int, float]] = {}
        for r in rows:
            if (r.get("status") == "ok" and r.get("load", "idle") == "idle" and r["direction"] == direction
                    and r["target"] != "pinned" and r["size_bytes"] in judged
                    and (p := pct(r["gbps"], refs[(direction, r["size_bytes"])])) is not None):
                per_path.setdefault(_path(r), {})[r["size_bytes"]] = p
        scored = sorted(((min(v.values()), p, v) for p, v in per_path.items() if len(v) == len(judged)),
                        key=lambda x: (-x[0], x[1]))
        by_target: dict[str, Any] = {}
        for score, p, _ in scored:
            by_target.setdefault(p[0], {"method": p[1], "streams": p[2], "pct_of_pinned": score})
        entry: dict[str, Any] = {"judged_sizes": judged, "threshold_pct": threshold, "best": None,
                                 "pct_of_pinned": None, "reaches_threshold": False, "by_target": by_target}
        if not judged:
            entry["why"] = "no pinned reference was measured in this direction"
        elif not scored:
            entry["why"] = "no non-pinned path was measured at every judged size"
        else:
            score, (target, method, streams), per_size = scored[0]
            entry.update(best={"target": target, "method": method, "streams": streams}, pct_of_pinned=score,
                         per_size_pct={str(s): v for s, v in sorted(per_size.items())},
                         reaches_threshold=score >= threshold)
        out[direction] = entry
    return out


def estimate_s(sizes: tuple[int, ...], reps: int, streams: tuple[int, ...] = STREAMS, with_compute: bool = False,
               gbps: float = ASSUMED_SLOW_GBPS) -> float:
    """Seconds for a run: every target x method x streams x direction at every size, reps + 1
    copies each at `gbps`, ~0.3 ms of calls and sync per copy, ~15 s of setup (cuInit, pinning)."""
    configs = len(TARGETS) * len(METHODS) * len(streams) * len(DIRECTIONS)
    copies = configs * len(sizes) * (reps + 1)
    seconds = 15.0 + configs * sum(sizes) * (reps + 1) / (gbps * 1e9) + copies * 3e-4
    if with_compute:  # 1 stream, largest size, ~1.5x the copies' span in matmuls beside them
        seconds += 2.5 * len(TARGETS) * len(METHODS) * len(DIRECTIONS) * max(sizes) * (reps + 1) / (gbps * 1e9) + 5
    return seconds




# -- measuring -------------------------------------------------------------------------------
def _gbps(nbytes: int, ms: list[float]) -> float | None:
    m = statistics.median(ms) if ms else 0.0
    return round(nbytes / (m / 1e3) / 1e9, 2) if m > 0 else None


def _timed_row(key: dict[str, Any], size: int, ev: list[float], wall: list[float]) -> dict[str, Any]:
    return {**key, "status": "ok", "gbps": _gbps(size, ev), "gbps_wall": _gbps(size, wall),
            "event_ms": [round(x, 4) for x in ev], "wall_ms": [round(x, 4) for x in wall]}


def _ends(probe: Probe, target_va: int, direction: str) -> tuple[int, int]:
    return (target_va, probe.device_va) if direction == "evict" else (probe.device_va, target_va)


def _why(e: Exception) -> dict[str, str]:
    """A refusal's call and error: the driver's CUresult name, or the Python exception (a
    cuda-python that differs from the one written against) so the run goes on and is recorded."""
    if isinstance(e, Refused):
        return {"call": e.call, "error": e.code}
    return {"call": "python", "error": f"{type(e).__name__}: {one_line(e)}"}


def measure(probe: Probe, sizes: tuple[int, ...], reps: int, streams: tuple[int, ...], deadline: float,
            refusals: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every target x method x streams x size x direction, idle: the rows (refused copies too)
    and the address of each target the driver made; each refusal also goes to `refusals`."""
    rows: list[dict[str, Any]] = []
    made: dict[str, int] = {}
    for target in TARGETS:
        try:
            made[target] = probe.target(target)
        except Exception as e:
            refusals.append({"target": target, "step": "create", **_why(e)})
            continue
        if target != "pinned":
            probe.info[f"granularity_{target}"] = probe.target_granularity(target)
        for method in METHODS:
            try:
                issue = probe.issue(method)
            except Exception as e:
                refusals.append({"target": target, "method": method, "step": "issue", **_why(e)})
                continue
            for n in streams:
                for size in sizes:
                    for direction in DIRECTIONS:
                        key = {"target": target, "method": method, "streams": n, "size_bytes": size,
                               "direction": direction, "load": "idle"}
                        if time.monotonic() > deadline:
                            refusals.append({**key, "step": "skipped", "call": None, "error": "--max-seconds spent"})
                            continue
                        try:
                            ev, wall = probe.time_copies(issue, *_ends(probe, made[target], direction),
                                                         split_plan(size, n), reps)
                        except Exception as e:
                            refusals.append({**key, "step": "copy", **_why(e)})
                            rows.append({**key, "status": "refused", "error": _why(e)["error"]})
                            continue
                        rows.append(_timed_row(key, size, ev, wall))
    return rows, made


def under_load(probe: Probe, made: dict[str, int], idle: list[dict[str, Any]], reps: int, deadline: float,
               refusals: list[dict[str, Any]]) -> dict[str, Any]:
    """Each idle 1-stream row of the largest size measured again beside bf16 matmuls on another
    stream (queued to last ~1.5x the copies' idle time): the copy rate under load, and how much
    slower the matmuls that ran wholly inside the copies were than alone. A copy done by SM
    kernels slows under load and slows the matmuls; a copy engine's does neither much."""
    try:
        load = MatmulLoad(probe)
    except ImportError as e:
        return {"skipped": f"torch is not importable: {e}"}
    except Exception as e:  # torch.cuda unavailable (Refused), out of memory, ...
        return {"skipped": f"torch cannot use the GPU: {one_line(e)}"}
    try:
        return _under_load(probe, load, made, idle, reps, deadline, refusals)
    except Exception as e:  # keep the idle rows: they are the probe's answer
        return {"failed": _why(e)}


def _under_load(probe: Probe, load: MatmulLoad, made: dict[str, int], idle: list[dict[str, Any]], reps: int,
                deadline: float, refusals: list[dict[str, Any]]) -> dict[str, Any]:
    alone = load.alone_ms()
    span0, span1 = probe.event(), probe.event()
    size = max(r["size_bytes"] for r in idle)
    rows = []
    for r in idle:
        if r.get("status") != "ok" or r["streams"] != 1 or r["size_bytes"] != size:
            continue
        key = {k: r[k] for k in ("target", "method", "streams", "size_bytes", "direction")} | {"load": "matmul"}
        if time.monotonic() > deadline:
            refusals.append({**key, "step": "skipped", "call": None, "error": "--max-seconds spent"})
            continue
        k = max(4, math.ceil(1.5 * sum(r["event_ms"]) * (reps + 1) / reps / alone))
        spans = load.enqueue(k)
        probe.record(span0, probe.origin)
        try:
            ev, wall = probe.time_copies(probe.issue(r["method"]), *_ends(probe, made[r["target"]], r["direction"]),
                                         [(0, size)], reps)
        except Exception as e:
            load.stream.synchronize()
            refusals.append({**key, "step": "copy", **_why(e)})
            continue
        probe.record(span1, probe.origin)
        load.stream.synchronize()
        inside = [probe.elapsed_ms(a, b) for a, b in spans
                  if probe.elapsed_ms(span0, a) >= 0 and probe.elapsed_ms(b, span1) >= 0]
        loaded = statistics.median(inside) if inside else None
        rows.append({**_timed_row(key, size, ev, wall), "matmuls_queued": k, "matmuls_inside_copies": len(inside),
                     "matmul_ms_loaded": None if loaded is None else round(loaded, 4),
                     "matmul_slowdown": None if loaded is None else round(loaded / alone, 3)})
    return {"matmul": "bf16 8192 x 8192 x 8192, torch.matmul", "matmul_ms_alone": round(alone, 4), "rows": rows}


# -- report ----------------------------------------------------------------------------------
MAPPING_LOCATIONS = ("device", "host_numa")
MAPPING_REPS = 5


def mapping_calls(probe: Probe, sizes: tuple[int, ...], reps: int, deadline: float,
                  refusals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per location and size: the median wall microseconds of each call in one handle's
    life (Probe.time_mapping_calls); a refusal is recorded, a size past the deadline skipped."""
    rows: list[dict[str, Any]] = []
    for location in MAPPING_LOCATIONS:
        for size in sizes:
            row: dict[str, Any] = {"location": location, "size_bytes": size, "reps": reps}
            if time.monotonic() > deadline:
                rows.append(row | {"status": "skipped"})
                continue
            try:
                times = probe.time_mapping_calls(location, size, reps)
            except Refused as e:
                refusals.append({"step": "mapping_calls", "target": location, "size_bytes": size, "call": e.call,
                                 "error": e.code})
                rows.append(row | {"status": "refused", "error": e.code})
                continue
            rows.append(row | {"status": "ok", "us": times,
                               "median_us": {k: round(statistics.median(v), 1) for k, v in times.items()}})
    return rows


def mapping_table(rows: list[dict[str, Any]]) -> str:
    calls = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease")
    out = ["mapping calls, median wall us:  location   size | " + " ".join(f"{c[5:]:>10}" for c in calls)]
    for r in rows:
        head = f"{'':32}{r['location']:>10} {r['size_bytes'] // MiB:>4}MiB | "
        if r.get("status") != "ok":
            out.append(head + r.get("status", "?") + (f" ({r['error']})" if r.get("error") else ""))
            continue
        out.append(head + " ".join(f"{r['median_us'][c]:>10.1f}" for c in calls))
    return "\n".join(out)


def table(rows: list[dict[str, Any]]) -> str:
    """target x method x streams x size x direction: GB/s (events), GB/s (wall), % of pinned."""
    head = f"{'direction':9} {'size':>8} {'target':17} {'method':12} {'str':>3} {'load':6} | " \
           f"{'GB/s':>7} {'wall':>7} {'%pinned':>7}"
    lines = [head, "-" * len(head)]
    order = {t: i for i, t in enumerate(TARGETS)} | {m: i for i, m in enumerate(METHODS)}
    for r in sorted(rows, key=lambda r: (DIRECTIONS.index(r["direction"]), r["size_bytes"], r.get("load", "idle"),
                                         order[r["target"]], order[r["method"]], r["streams"])):
        cells = (f"{r['gbps'] or 0:>7.2f} {r['gbps_wall'] or 0:>7.2f} {_fmt_pct(r.get('pct_of_pinned')):>7}"
                 if r.get("status") == "ok" else f"refused: {r.get('error')}")
        lines.append(f"{r['direction']:9} {r['size_bytes'] // MiB:>5}MiB {r['target']:17} {r['method']:12} "
                     f"{r['streams']:>3} {r.get('load', 'idle'):6} | {cells}")
    return "\n".join(lines)


def _fmt_pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.1f}%"


def verdict_lines(v: dict[str, Any]) -> list[str]:
    out = []
    for direction in DIRECTIONS:
        e = v[direction]
        judged = ", ".join(f"{s // MiB}" for s in e["judged_sizes"]) + " MiB"
        if e["best"] is None:
            out.append(f"VERDICT {direction}: no non-pinned path to judge ({e.get('why')}): reaches "
                       f"{e['threshold_pct']:.0f}%: NO")
            continue
        b = e["best"]
        out.append(f"VERDICT {direction}: best non-pinned path {b['target']} / {b['method']} / {b['streams']} "
                   f"stream(s): {e['pct_of_pinned']:.1f}% of pinned (lowest over {judged}); reaches "
                   f"{e['threshold_pct']:.0f}%: {'YES' if e['reaches_threshold'] else 'NO'}")
    return out


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status 2, with one line on stderr, where cuda-python, a CUDA driver or a device is missing.")
    ap.add_argument("--sizes", type=parse_sizes, default=None,
                    help="comma-separated copy sizes, e.g. 2MiB,32MiB,256MiB (the default; --quick: 32MiB)")
    ap.add_argument("--reps", type=int, default=None, help="timed copies per row, after one warm-up (default 10; "
                                                           "--quick: 3); the median is reported")
    ap.add_argument("--quick", action="store_true", help="32 MiB (unless --sizes), 3 reps, 1 and 2 streams")
    ap.add_argument("--with-compute", action="store_true",
                    help="also time 1-stream copies of the largest size beside a matmul loop (needs torch with CUDA)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=300.0,
                    help="stop measuring after this; the rest is recorded as skipped (default 300)")
    ap.add_argument("--out", default="benchmarks/results/probe_copy_paths-{date}.json",
                    help="JSON path; {date} is filled in")
    ap.add_argument("--note", action="append", default=[], help="stored in the JSON (repeatable)")
    args = ap.parse_args(argv)
    sizes = args.sizes or ((32 * MiB,) if args.quick else DEFAULT_SIZES)
    reps = args.reps if args.reps is not None else (3 if args.quick else 10)
    if reps < 1:
        ap.error("--reps must be at least 1")
    streams = (1, 2) if args.quick else STREAMS
    try:
        d = load_driver()
    except Missing as e:
        print(f"probe_copy_paths: {one_line(e)}", file=sys.stderr)
        return 2
    estimate = estimate_s(sizes, reps, streams, args.with_compute)
    print(f"probe_copy_paths: estimated run time ~{estimate:.0f} s (every path at {ASSUMED_SLOW_GBPS:.0f} GB/s or "
          f"faster); stops measuring after {args.max_seconds:.0f} s", flush=True)
    t0 = time.monotonic()
    deadline = t0 + args.max_seconds
    refusals: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        try:
            probe = Probe(d, args.device, max(sizes), max(streams), stack)
        except Missing as e:
            print(f"probe_copy_paths: {one_line(e)}", file=sys.stderr)
            return 2
        except Refused as e:
            print(f"probe_copy_paths: setting up the device buffer failed: {one_line(e)}", file=sys.stderr)
            return 1
        rows, made = measure(probe, sizes, reps, streams, deadline, refusals)
        compute = under_load(probe, made, rows, reps, deadline, refusals) if args.with_compute else None
        mapping = mapping_calls(probe, sizes, MAPPING_REPS, deadline, refusals)
    if compute and "rows" in compute:
        rows += compute.pop("rows")
    rows = with_pct(rows)
    from lib.provenance import git_info, machine_info

    record = {"benchmark": "probe_copy_paths", "device": probe.info,
              "provenance": {"machine": machine_info(), "git": git_info(), "date": _dt.date.today().isoformat(),
                             "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])},
              "settings": {"sizes_bytes": list(sizes), "reps": reps, "streams": list(streams), "targets": list(TARGETS),
                           "methods": list(METHODS), "reference": dict(zip(("target", "method", "streams"), REFERENCE)),
                           "threshold_pct": THRESHOLD, "judged_from_bytes": JUDGED_FROM, "quick": args.quick,
                           "with_compute": args.with_compute},
              "estimate_s": round(estimate, 1), "elapsed_s": round(time.monotonic() - t0, 1), "notes": args.note,
              "rows": rows, "refusals": refusals, "compute_load": compute, "verdict": verdict(rows),
              "mapping_calls": mapping}
    out = Path(args.out.format(date=record["provenance"]["date"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{probe.info['name']}, driver {probe.info['driver_version']}, median of {reps}; "
          f"% of pinned = of the pinned memcpy_async 1-stream row of the same direction and size")
    print(table(rows))
    for r in refusals:
        print("refused: " + ", ".join(f"{k}={v}" for k, v in r.items() if v is not None))
    if compute:
        print(f"compute load: {json.dumps({k: v for k, v in compute.items()})}")
    print(mapping_table(mapping))
    print("\n".join(verdict_lines(record["verdict"])))
    print(f"wrote {out} ({record['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
