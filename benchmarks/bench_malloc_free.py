"""bench_malloc_free: malloc+free pairs per second on one vtalloc AddressSpace (issue 2, item 6).

Owns: the malloc/free micro-benchmark and the JSON record it writes. Not a test: it asserts
nothing about speed and lives outside ``testpaths``. One "op" is one malloc followed by one
free. What it times, per backend:

* reuse  - steady state: malloc+free of one size over and over, 1/2/4 threads sharing one
           space; the pages stay cached, so no driver call happens (checked: the map, unmap and
           reclaim counters must not move while timing).
* map    - the path of a malloc that finds nothing cached: capacity == the allocation size,
           and before each timed pair an untimed trim() gives every cached page back, so the
           timed malloc must create, map and set access on its pages again (checked exactly:
           map and unmap calls = timed ops x the handles one such malloc gets, no reclaim).
           Allocations share pages now, so a freed small block no longer
           pins a page of the cached range: the 512 B malloc+free this case used to break the
           range with left it whole, and no page was reclaimed.
* references - a bare ctypes call, a 3-argument ctypes call to a trivial getter, the raw
           ctypes malloc+free without the Python wrapper, two no-op Python calls, the clock,
           and (when a C compiler is there) the same loops in C through native_loop.c, so
           readers can see how much of a pair is Python and ctypes and how much the core.

Every row's check (lib/path_check.py) is in the JSON beside its figures (``path_check``, and
``path_checked`` for the run); a row that measured another path makes the script exit 1 naming
it and what it measured, after the JSON is written.

Run from the repository root:  python benchmarks/bench_malloc_free.py [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Callable

from lib.path_check import check, failed, summary
from lib.provenance import git_info, machine_info
from saved_activation_sizes import Placement, backing
from vtalloc.allocator import AddressSpace, _native, backend_available

KiB, MiB = 1 << 10, 1 << 20
SMALL_SIZES = [512, 4 * KiB, 64 * KiB]
LARGE_SIZES = [2 * MiB, 8 * MiB, 64 * MiB]
THREADS = [1, 2, 4]
STEADY_CAPACITY = 512 * MiB  # room for 4 threads x 64 MiB live at once, plus the pages of small blocks
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "benchmarks/results/malloc_free-{backend}-{date}.json"


# -- timing ----------------------------------------------------------------------------------
def measure(run: Callable[[int], int], ops_per_iter: int, target_s: float, repeats: int) -> dict[str, Any]:
    """Calibrate n so one run(n) lasts about target_s, then time `repeats` runs.

    run(n) does n iterations and returns the nanoseconds they took; each iteration is
    ops_per_iter ops (one per thread).
    """
    target_ns = target_s * 1e9
    n = 16
    while True:
        spent = run(n)
        if spent >= target_ns / 2 or n >= 1 << 26:
            n = max(1, int(n * target_ns / max(spent, 1))) if spent < target_ns else n
            break
        n *= 4
    per_op = [run(n) / (n * ops_per_iter) for _ in range(repeats)]
    return summarize(per_op, n)


def summarize(per_op: list[float], n: int) -> dict[str, Any]:
    med = statistics.median(per_op)
    return {
        "iterations_per_repeat": n,
        "repeats_ns_per_op": [round(x, 2) for x in per_op],
        "median_ns_per_op": round(med, 2),
        "median_ops_per_s": round(1e9 / med, 1),
        "min_ns_per_op": round(min(per_op), 2),
        "max_ns_per_op": round(max(per_op), 2),
    }


def counters(space: AddressSpace) -> tuple[int, int, int]:
    s = space.stats()
    return s.num_map_calls, s.num_unmap_calls, s.num_page_reclaims


def deltas(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, int]:
    return {k: a - b for k, b, a in zip(("map_calls", "unmap_calls", "page_reclaims"), before, after)}


# -- the Python API paths --------------------------------------------------------------------
def bench_reuse(backend: str, size: int, threads: int, target_s: float, repeats: int) -> dict[str, Any]:
    with AddressSpace(backend=backend, capacity=STEADY_CAPACITY) as space:
        malloc, free = space.malloc, space.free
        # Warm up: map what `threads` live allocations need, so every timed malloc hits the cache.
        for addr in [malloc(size) for _ in range(threads)]:
            free(addr)

        if threads == 1:
            def run(n: int) -> int:
                t0 = perf_counter_ns()
                for _ in range(n):
                    free(malloc(size))
                return perf_counter_ns() - t0
        else:
            def run(n: int) -> int:
                return run_threads(malloc, free, size, threads, n)

        res = measure(run, threads, target_s, 1)  # calibration and one discarded run
        before = counters(space)
        res = measure_fixed(run, threads, res["iterations_per_repeat"], repeats)
        res.update(deltas(before, counters(space)))
        res["page_bytes"] = space.page_bytes
        res["capacity_bytes"] = space.capacity_bytes
    row = {"path": "reuse", "layer": "python_api", "size_bytes": size, "threads": threads, **res}
    return checked(row, space.config.extent_size)


def measure_fixed(run: Callable[[int], int], ops_per_iter: int, n: int, repeats: int) -> dict[str, Any]:
    return summarize([run(n) / (n * ops_per_iter) for _ in range(repeats)], n)


def run_threads(malloc: Callable[[int], int], free: Callable[[int], None], size: int, threads: int, n: int) -> int:
    """Wall time of `threads` threads each doing n malloc+free pairs on one shared space."""
    start = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work() -> None:
        start.wait()
        try:
            for _ in range(n):
                free(malloc(size))
        except BaseException as e:  # reported below: a failed run must not look fast
            errors.append(e)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    t0 = perf_counter_ns()
    for w in workers:
        w.join()
    spent = perf_counter_ns() - t0
    if errors:
        raise errors[0]
    return spent


def bench_map(backend: str, size: int, target_s: float, repeats: int) -> dict[str, Any]:
    with AddressSpace(backend=backend, capacity=size) as space:
        malloc, free, trim = space.malloc, space.free, space.trim

        def run(n: int) -> int:
            total = 0
            for _ in range(n):
                trim()  # untimed: every cached page goes back to the driver
                t0 = perf_counter_ns()
                free(malloc(size))  # must create, map and set access on its pages again
                total += perf_counter_ns() - t0
            return total

        res = measure(run, 1, target_s, 1)
        before = counters(space)
        res = measure_fixed(run, 1, res["iterations_per_repeat"], repeats)
        res.update(deltas(before, counters(space)))
        page = space.page_bytes
        res["page_bytes"] = page
        res["capacity_bytes"] = space.capacity_bytes
    ops = res["iterations_per_repeat"] * repeats
    res["timed_ops"] = ops
    res["map_calls_per_op"] = round(res["map_calls"] / ops, 3)
    res["pages_per_alloc"] = -(-size // page)
    res["median_ns_per_mapped_page"] = round(res["median_ns_per_op"] / res["pages_per_alloc"], 2)
    row = {"path": "map", "layer": "python_api", "size_bytes": size, "threads": 1, **res}
    return checked(row, space.config.extent_size)


# -- did each row measure the path it names? (issue 26) ----------------------------------------
def row_name(row: dict[str, Any]) -> str:
    return f"{row['layer']} {row['path']} {size_label(row['size_bytes'])} x{row['threads']}"


def map_handles(size: int, page_bytes: int, extent_bytes: int | None) -> int:
    """Driver map calls of one malloc of ``size`` into an empty space: one per physical handle
    (one-page handles, or extents), by the core's rule as saved_activation_sizes.backing copies it."""
    placement = Placement(page_bytes, extent_bytes if extent_bytes is not None else Placement().extent_bytes)
    return len(backing(size, placement).handles)


def path_check(row: dict[str, Any], extent_bytes: int | None) -> dict[str, Any]:
    """The check of one row, from its counter deltas over the timed repeats.

    reuse: the cached path only, so no map, unmap or reclaim at all. map: each timed malloc maps
    exactly the handles a fresh allocation of its size gets and each untimed trim unmaps them, so
    map_calls == unmap_calls == timed ops x handles, and no reclaim (nothing is cached to take)."""
    measured = {k: row[k] for k in ("map_calls", "unmap_calls", "page_reclaims")}
    if row["path"] == "reuse":
        expected = {"map_calls": 0, "unmap_calls": 0, "page_reclaims": 0}
    else:
        calls = row["timed_ops"] * map_handles(row["size_bytes"], row["page_bytes"], extent_bytes)
        expected = {"map_calls": calls, "unmap_calls": calls, "page_reclaims": 0}
    return check(row_name(row), row["path"], expected, measured)


def checked(row: dict[str, Any], extent_bytes: int | None) -> dict[str, Any]:
    """The row with its check recorded beside the figures (``path_check``; ``cached_path_only`` or
    ``map_path_taken``, the names earlier records used, now the exact check's outcome)."""
    row["path_check"] = path_check(row, extent_bytes)
    row["cached_path_only" if row["path"] == "reuse" else "map_path_taken"] = row["path_check"]["passed"]
    return row


# -- references ------------------------------------------------------------------------------
def bench_references(backend: str, target_s: float, repeats: int) -> list[dict[str, Any]]:
    lib = _native.load()
    out = []

    abi = lib.vta_abi_version

    def bare(n: int) -> int:
        t0 = perf_counter_ns()
        for _ in range(n):
            abi()
        return perf_counter_ns() - t0

    out.append({"name": "ctypes_bare_call", "what": "one ctypes call with no arguments: lib.vta_abi_version()",
                **measure(bare, 1, target_s, repeats)})

    with AddressSpace(backend=backend, capacity=STEADY_CAPACITY) as space:
        handle = space._handle  # the raw vta_space*: bypasses the wrapper on purpose
        vmalloc, vfree = lib.vta_malloc, lib.vta_free
        addr = ctypes.c_uint64()
        ref = ctypes.byref(addr)

        def raw(n: int) -> int:
            t0 = perf_counter_ns()
            for _ in range(n):
                if vmalloc(handle, 512, 0, ref) or vfree(handle, addr.value):
                    raise RuntimeError("vta_malloc/vta_free failed in the raw ctypes loop")
            return perf_counter_ns() - t0

        kind, dev = ctypes.c_int32(), ctypes.c_int32()
        kref, dref = ctypes.byref(kind), ctypes.byref(dev)
        getter = lib.vta_space_backend

        def three_args(n: int) -> int:
            t0 = perf_counter_ns()
            for _ in range(n):
                getter(handle, kref, dref)
            return perf_counter_ns() - t0

        out.append({"name": "ctypes_call_3_args",
                    "what": "one ctypes call with 3 arguments to a trivial getter: lib.vta_space_backend(h, &kind, &dev)",
                    **measure(three_args, 1, target_s, repeats)})

        raw(16)
        out.append({"name": "ctypes_raw_malloc_free_512B",
                    "what": "lib.vta_malloc + lib.vta_free through ctypes, no Python wrapper or validation",
                    **measure(raw, 1, target_s, repeats)})

    def noop_malloc(nbytes: int) -> int:
        return nbytes

    def noop_free(address: int) -> None:
        return None

    def noop(n: int) -> int:
        t0 = perf_counter_ns()
        for _ in range(n):
            noop_free(noop_malloc(512))
        return perf_counter_ns() - t0

    out.append({"name": "python_noop_pair", "what": "free(malloc(512)) with two Python functions that do nothing",
                **measure(noop, 1, target_s, repeats)})

    def timer(n: int) -> int:
        total = 0
        t0 = perf_counter_ns()
        for _ in range(n):
            t = perf_counter_ns()
            total += perf_counter_ns() - t
        return perf_counter_ns() - t0

    out.append({"name": "timer_pair_overhead",
                "what": "a perf_counter_ns() pair and an add: the per-op clock cost inside the map loop",
                **measure(timer, 1, target_s, repeats)})
    return out


# -- the same loops in C ---------------------------------------------------------------------
def build_native(workdir: str) -> tuple[str | None, str]:
    """Compile native_loop.c against the installed library; (path, "") or (None, why not)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        return None, "no C compiler found (set CC)"
    header_dir = REPO / "csrc" / "include"
    if not (header_dir / "vtalloc" / "vtalloc.h").is_file():
        return None, f"C header not found under {header_dir} (run from a source checkout)"
    lib = Path(_native.library_path()).resolve()
    exe = str(Path(workdir) / "native_loop")
    cmd = [cc, "-O2", "-std=c11", "-pthread", f"-I{header_dir}", str(Path(__file__).with_name("native_loop.c")),
           str(lib), f"-Wl,-rpath,{lib.parent}", "-o", exe]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"compiling native_loop.c failed: {proc.stderr.strip()[:500]}"
    return exe, ""


def run_native(exe: str, backend: str, capacity: int, mode: str, size: int, threads: int,
               target_s: float, repeats: int) -> dict[str, Any]:
    code = _native.BACKEND_CODES[backend]
    args = [exe, str(code), str(capacity), mode, str(size), str(threads), str(target_s * 1000), str(repeats)]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} failed: {proc.stderr.strip()}")
    raw = json.loads(proc.stdout)
    res = summarize(raw["repeats_ns_per_op"], raw["pairs_per_thread_per_repeat"])
    res.update({k: raw[k] for k in ("map_calls", "unmap_calls", "page_reclaims", "page_bytes", "capacity_bytes",
                                    "timed_ops")})
    entry = {"path": "reuse" if mode == "steady" else "map", "layer": "native_c", "size_bytes": size,
             "threads": threads, **res}
    if mode != "steady":
        entry["map_calls_per_op"] = round(res["map_calls"] / raw["timed_ops"], 3)
        entry["pages_per_alloc"] = -(-size // raw["page_bytes"])
        entry["median_ns_per_mapped_page"] = round(res["median_ns_per_op"] / entry["pages_per_alloc"], 2)
    return checked(entry, None)  # native_loop.c creates its space at default settings


# -- provenance: machine_info() and git_info() come from lib/provenance.py ---------------------
def vtalloc_info() -> dict[str, Any]:
    try:
        from importlib.metadata import version
        ver = version("vtalloc")
    except Exception:  # not installed as a distribution: record that, do not fail the run
        ver = None
    return {"version": ver, "abi_version": _native.load().vta_abi_version(), "library": _native.library_path()}


# -- output ----------------------------------------------------------------------------------
def size_label(n: int) -> str:
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def markdown(record: dict[str, Any]) -> str:
    rows = ["| path | layer | size | threads | median ns/op | median ops/s | min-max ns/op | map/unmap/reclaims while timed (map: and the untimed trims) |",
            "|---|---|---|---|---:|---:|---|---|"]
    for r in record["results"]:
        rows.append(f"| {r['path']} | {r['layer']} | {size_label(r['size_bytes'])} | {r['threads']} | "
                    f"{r['median_ns_per_op']:,.0f} | {r['median_ops_per_s']:,.0f} | "
                    f"{r['min_ns_per_op']:,.0f}-{r['max_ns_per_op']:,.0f} | "
                    f"{r['map_calls']}/{r['unmap_calls']}/{r['page_reclaims']} |")
    rows += ["", "| reference | median ns/op | median ops/s |", "|---|---:|---:|"]
    for r in record["references"]:
        rows.append(f"| {r['name']} ({r['what']}) | {r['median_ns_per_op']:,.1f} | {r['median_ops_per_s']:,.0f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["all", "host", "cuda"], default="all",
                   help="all (default): host, and cuda when a device is usable")
    p.add_argument("--quick", action="store_true", help="3 short repeats per config instead of 5 longer ones")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help="JSON path; {backend} and {date} are filled in (default: %(default)s)")
    p.add_argument("--no-native", action="store_true", help="skip the C loops (native_loop.c)")
    p.add_argument("--note", action="append", default=[], help="a note stored in the JSON (repeatable)")
    args = p.parse_args(argv)

    repeats, target_s = (3, 0.03) if args.quick else (5, 0.12)
    backends = ["host", "cuda"] if args.backend == "all" else [args.backend]
    unavailable: dict[str, str] = {}
    for b in list(backends):
        ok, why = backend_available(b)
        if not ok:
            print(f"{b}: not available here: {why}")
            unavailable[b] = why
            backends.remove(b)

    for backend in backends:
        now = _dt.datetime.now(_dt.timezone.utc)
        record: dict[str, Any] = {
            "benchmark": "malloc_free",
            "schema": 1,
            "backend": backend,
            "date": now.isoformat(timespec="seconds"),
            "command": shlex.join([Path(sys.executable).name, *sys.argv]),
            "git": git_info(),
            "vtalloc": vtalloc_info(),
            "machine": machine_info(),
            "settings": {"quick": args.quick, "repeats": repeats, "target_seconds_per_repeat": target_s,
                         "steady_capacity_bytes": STEADY_CAPACITY, "op": "one malloc followed by one free",
                         "ns_per_op_with_threads": "wall time / pairs done by all threads together"},
            "not_available": {b: why for b, why in unavailable.items()},
            "notes": args.note,
            "results": [],
            "references": [],
            "native": None,
        }
        print(f"== {backend}: {record['machine']['cpu_model']}, {record['machine']['usable_cores']} usable cores, "
              f"load {record['machine']['load_average_at_start']}")
        t_start = time.monotonic()
        for size in SMALL_SIZES + LARGE_SIZES:
            for threads in THREADS:
                r = bench_reuse(backend, size, threads, target_s, repeats)
                record["results"].append(r)
                print(f"reuse  {size_label(size):>8} x{threads}: {r['median_ns_per_op']:>10,.0f} ns/op "
                      f"{r['median_ops_per_s']:>12,.0f} ops/s  (map/unmap {r['map_calls']}/{r['unmap_calls']})")
        for size in LARGE_SIZES:
            r = bench_map(backend, size, target_s, repeats)
            record["results"].append(r)
            print(f"map    {size_label(size):>8} x1: {r['median_ns_per_op']:>10,.0f} ns/op "
                  f"{r['median_ops_per_s']:>12,.0f} ops/s  ({r['map_calls_per_op']} map calls/op)")
        record["references"] = bench_references(backend, target_s, repeats)
        for r in record["references"]:
            print(f"ref    {r['name']}: {r['median_ns_per_op']:,.1f} ns/op")

        if args.no_native:
            record["native"] = {"skipped": "--no-native"}
        else:
            with tempfile.TemporaryDirectory(prefix="vtalloc-bench-") as tmp:
                exe, why = build_native(tmp)
                if exe is None:
                    record["native"] = {"skipped": why}
                    print(f"native: skipped: {why}")
                else:
                    record["native"] = {"source": "benchmarks/native_loop.c"}
                    for size in SMALL_SIZES + LARGE_SIZES:
                        for threads in THREADS:
                            r = run_native(exe, backend, STEADY_CAPACITY, "steady", size, threads, target_s, repeats)
                            record["results"].append(r)
                            print(f"C reuse {size_label(size):>8} x{threads}: {r['median_ns_per_op']:>10,.0f} ns/op")
                    for size in LARGE_SIZES:
                        r = run_native(exe, backend, size, "map", size, 1, target_s, repeats)
                        record["results"].append(r)
                        print(f"C map   {size_label(size):>8} x1: {r['median_ns_per_op']:>10,.0f} ns/op")

        record["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        record["wall_seconds"] = round(time.monotonic() - t_start, 1)
        record["path_checked"] = summary(r["path_check"] for r in record["results"])
        problems = failed(r["path_check"] for r in record["results"])
        record["problems"] = problems

        out = Path(args.out.format(backend=backend, date=now.date().isoformat()))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {out} ({record['wall_seconds']} s)\n")
        print(markdown(record))
        if problems:
            print("\nPATH CHECK FAILED: these rows measured another path than they name (figures not "
                  "comparable):\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
