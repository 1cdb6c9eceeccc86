"""bench_trace: replay real models' allocation traces (benchmarks/traces/) on vtalloc, and on a GPU
against PyTorch's own allocators.

Owns: the host replay of one trace on a fresh host-backend ``AddressSpace`` (a tight ctypes loop
over ``vta_malloc`` / ``vta_free``), the smallest capacity that replays a trace with no OOM
(searched by capacity_search.py, which the simulation of PyTorch's allocators shares), the
per-trace figures (peak live, page-rounded peak, min capacity and its bound,
peak mapped, driver calls, modeled H100 driver time, CPU time per op), the JSON record and its
Markdown table, ``--compare`` of two records (the gate an allocation-policy change must pass),
and the GPU mode ``--torch``: the same trace through ``torch.empty`` / ``del`` under the native
caching allocator, ``expandable_segments`` and vtalloc, each try in its own process.
Invariants: every replay builds a fresh space (or, on a GPU, a fresh process) and closes it:
nothing is reused between tries, so a try's outcome depends on its capacity only; a replay stops
at its first OOM; frees follow the trace's order; nothing writes the bytes; no figure is printed
that was not measured in the run (a modeled H100 time is the cost model's prediction, and is
named so); trace stream 0 is the space's default stream, each other trace stream one host stream
of the space (destroyed before the space closes).
Why this file is long: the host replay, the GPU mode (its device-agnostic
body, the torch device and the per-allocator processes) and --compare share one trace model and
one record format; split, each half would have to restate them.

    python benchmarks/bench_trace.py                                  # every stored trace, default Config
    python benchmarks/bench_trace.py --trace resnet50 --quick --label after
    python benchmarks/bench_trace.py --trace bert --page-size 32MiB --config host_granularity=2MiB
    python benchmarks/bench_trace.py --trace resnet50 --capacity 6GiB  # one capacity, no search
    python benchmarks/bench_trace.py --compare before.json after.json # exit 1 if "after" misses a bound
    python benchmarks/bench_trace.py --torch --max-seconds 390        # GPU: native, expandable, vtalloc
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # trace_format and provenance sit beside this file

from lib import trace_format  # noqa: E402
from lib.capacity_search import BenchError, search_min  # noqa: E402
from lib.path_check import check, failed, summary  # noqa: E402
# provenance at import, not inside _provenance(): tests load this file with the folder on sys.path
# only while it loads (helpers/benchmarks.py), so a later import of it failed run alone
from lib.provenance import git_info, machine_info  # noqa: E402

MiB = 1 << 20
# The page-rounded peak: a property of the trace, whatever the Config (what whole-page rounding of
# every allocation above 1 MiB to 2 MiB pages costs, the rest in 512 B blocks).
ROUND_THRESHOLD = 1 * MiB
ROUND_PAGE = 2 * MiB
ROUND_BLOCK = 512
# The bound a policy must meet: min capacity <= peak live + max(2% of peak live, 4 pages).
BOUND_PERCENT = 2
BOUND_PAGES = 4
MEASURE_MULTIPLE = 4       # driver calls, modeled time and CPU time are measured at 4x peak live
# --compare: an "after" row misses when...
PEAK_MAPPED_LIMIT = 1.25   # ... peak mapped at 4x > 1.25 x peak live
REGRESSION_LIMIT = 1.10    # ... calls/op or modeled time/op > 1.1 x before
REPEATS, QUICK_REPEATS = 3, 1
ALLOCATORS = ("native", "expandable", "vtalloc")
DEFAULT_OUT = "benchmarks/results/trace-{backend}-{date}.json"
# Config fields the bench sets itself: --config may not name them.
BENCH_OWNED = {"backend": "the bench replays on the host backend (--torch for a GPU)", "device": "host backend only",
               "capacity": "use --capacity", "cost_model": "the bench runs its own h100 cost-model replay"}


class UsageError(ValueError):
    """A bad command line: main() reports it and exits 2."""


class HostMemoryLimit(BenchError):
    """A host replay at a capacity above the host memory limit, refused before it starts."""


def mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# The host backend fills the page tables of every mapping it gives access to (set_access does
# MADV_POPULATE_WRITE on the page's memfd), so each byte a replay maps is a byte of this machine's
# memory until it is unmapped: a replay may hold up to its capacity. Capacities above this are
# refused (HostMemoryLimit) rather than risk the kernel's OOM killer; --host-memory-limit sets it.
HOST_MEMORY_SHARE = 0.6  # default limit: this share of MemAvailable when the bench starts


# -- the trace ---------------------------------------------------------------------------------------

def resolve_trace(spec: str) -> list[Path]:
    """The traces a --trace names: a file, a folder of them, or a bare name (benchmarks/traces/NAME.json.gz)."""
    try:
        return trace_format.resolve(spec)
    except trace_format.TraceNotFound as e:
        raise UsageError(str(e)) from None


def page_rounded(size: int) -> int:
    """One allocation as whole-page rounding keeps it: 2 MiB pages above 1 MiB, else 512 B blocks."""
    unit = ROUND_PAGE if size > ROUND_THRESHOLD else ROUND_BLOCK
    return -(-size // unit) * unit


def peak_page_rounded_bytes(trace: trace_format.Trace) -> int:
    live = peak = 0
    sizes: dict[int, int] = {}
    for e in trace.events:
        if e[0] == "a":
            n = sizes[e[1]] = page_rounded(e[2])
            live += n
            peak = max(peak, live)
        else:
            live -= sizes.pop(e[1])
    return peak


def bound_bytes(peak_live: int, page_bytes: int) -> int:
    """peak live + max(2% of peak live (rounded up to a byte), 4 pages)."""
    return peak_live + max(-(-peak_live * BOUND_PERCENT // 100), BOUND_PAGES * page_bytes)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A trace as the host loop wants it: (is_alloc, id, size, trace stream) per event."""

    name: str
    ops: tuple[tuple[bool, int, int, int], ...]
    num_ids: int
    streams: tuple[int, ...]   # trace stream numbers used, 0 included if used

    @classmethod
    def of(cls, trace: trace_format.Trace) -> "Compiled":
        ops = tuple((True, e[1], e[2], e[3]) if e[0] == "a" else (False, e[1], 0, 0) for e in trace.events)
        return cls(trace.name, ops, trace.num_allocs, tuple(trace.streams))


# -- the host replay ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Replay:
    capacity_bytes: int             # what the space got (whole pages)
    ok: bool                        # every event replayed, no OOM
    events_done: int                # events replayed before the OOM (all of them when ok)
    oom_event: int | None           # index of the allocation that failed
    oom_size: int | None
    wall_ns: int                    # the timed loop only (not the space, streams or clean-up)
    user_ns: int                    # this process's user CPU time over the loop (every thread)
    sys_ns: int                     # ... and kernel time (the host backend's mmap, memfd, page population)
    peak_mapped_bytes: int
    driver_calls: dict[str, int]    # during the loop, by kind (Stats.driver_calls() names), and "total"
    setup_driver_calls: int         # made by creating the space and its streams (not in driver_calls)
    modeled_ns: int | None          # the cost model's clock over the loop; None without a model
    counted: dict[str, int] = dataclasses.field(default_factory=dict)  # the space's counters over the loop
    done: dict[str, int] = dataclasses.field(default_factory=dict)     # mallocs and frees the loop made

    @property
    def ns_per_op(self) -> float:
        return self.wall_ns / self.events_done if self.events_done else 0.0


def _calls(stats: Any) -> dict[str, int]:
    calls = stats.driver_calls()
    return {**calls, "total": sum(calls.values())}


def _rusage_ns() -> tuple[int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return int(r.ru_utime * 1e9), int(r.ru_stime * 1e9)


def replay_host(compiled: Compiled, config: Any, capacity: int, host_limit: int | None = None) -> Replay:
    """Replay the whole trace once on a fresh host-backend space of ``capacity`` bytes; stop at
    the first OOM. The space is closed before this returns, whatever happened. A capacity above
    ``host_limit`` is refused (HostMemoryLimit) before any space is built."""
    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator import _native
    from vtalloc.allocator.errors import OutOfMemoryError

    if host_limit is not None and capacity > host_limit:
        raise HostMemoryLimit(f"a capacity of {capacity} B is above the host memory limit of {host_limit} B "
                              "(the host backend populates what it maps; see --host-memory-limit)")
    space = AddressSpace(config=config.replace(capacity=capacity))
    made: list[int] = []
    try:
        stream_of = {0: 0}
        for s in compiled.streams:
            if s:
                stream_of[s] = space._create_stream()
                made.append(stream_of[s])
        ops = [(a, i, n, stream_of[s]) for a, i, n, s in compiled.ops] if made else compiled.ops
        before = space.stats()
        m0 = space.modeled_ns()
        lib = space._lib
        malloc, free = lib.vta_malloc, lib.vta_free
        h = ctypes.c_void_p(space._h())
        out = ctypes.c_uint64()
        ref = ctypes.byref(out)
        addrs = [0] * compiled.num_ids
        status, stop = 0, len(ops)
        u0, s0 = _rusage_ns()
        t0 = time.perf_counter_ns()
        for k, (is_alloc, ident, size, stream) in enumerate(ops):
            if is_alloc:
                status = malloc(h, size, stream, ref)
                if status:
                    stop = k
                    break
                addrs[ident] = out.value
            else:
                status = free(h, addrs[ident])
                if status:
                    stop = k
                    break
        wall = time.perf_counter_ns() - t0
        u1, s1 = _rusage_ns()
        oom_event = oom_size = None
        if status:
            try:
                _native.check(status)
            except OutOfMemoryError:
                oom_event, oom_size = stop, ops[stop][2]
                if not ops[stop][0]:
                    raise BenchError(f"{compiled.name}: a free (event {stop}) reported out of memory") from None
        after = space.stats()
        m1 = space.modeled_ns()
        calls0 = _calls(before)
        calls = {k: v - calls0[k] for k, v in _calls(after).items()}
        live: set[int] = set()
        for is_alloc, ident, _, _ in ops[:stop]:
            (live.add if is_alloc else live.discard)(ident)
        b, a = before.as_dict(), after.as_dict()
        counted = {k: a[k] - b[k] for k in ("num_allocs", "num_frees", "evictions", "restores", "pressure_evictions",
                                            "num_extent_splits")}
        mallocs = sum(1 for op in ops[:stop] if op[0])
        for ident in sorted(live):  # clean up: a stream with a live allocation cannot be destroyed
            space.free(addrs[ident])
        for s in made:
            space._destroy_stream(s)
        return Replay(capacity_bytes=space.capacity_bytes, ok=oom_event is None, events_done=stop,
                      oom_event=oom_event, oom_size=oom_size, wall_ns=wall, user_ns=u1 - u0, sys_ns=s1 - s0,
                      peak_mapped_bytes=after.peak_mapped_bytes, driver_calls=calls,
                      setup_driver_calls=_calls(before)["total"],
                      modeled_ns=None if m0 is None or m1 is None else m1 - m0,
                      counted=counted, done={"mallocs": mallocs, "frees": stop - mallocs})
    finally:
        space.close()


# -- one trace on the host ---------------------------------------------------------------------------

def replay_check(row: str, replay: Replay, modeled: bool) -> dict[str, Any]:
    """The replay ran the trace through this space's malloc and free and nothing else: the space
    counted exactly the mallocs and frees the loop made (the one that failed at an OOM is not
    counted), nothing was evicted or restored (nothing is marked evictable), and the cost model's
    clock ran exactly in the replay that reports modeled time (the CPU-time replays have none)."""
    c = replay.counted
    measured = {**c, "modeled": replay.modeled_ns is not None}
    expected = {"num_allocs": replay.done.get("mallocs"), "num_frees": replay.done.get("frees"), "evictions": 0,
                "restores": 0, "pressure_evictions": 0, "modeled": modeled}
    return check(row, "malloc/free replay" + (" (cost model)" if modeled else ""), expected, measured)


def _per_op(total: int | None, ops: int) -> float | None:
    return None if total is None or not ops else total / ops


def _at(replays: list[Replay], modeled: Replay, peak_live: int, *, cpu: bool) -> dict[str, Any]:
    """The figures of one capacity: the first plain replay's counters, the modeled replay's clock."""
    first = replays[0]
    ops = first.events_done
    row: dict[str, Any] = {
        "capacity_bytes": first.capacity_bytes, "ok": first.ok and modeled.ok, "events": ops,
        "oom": None if first.ok else {"event": first.oom_event, "size": first.oom_size},
        "peak_mapped_bytes": first.peak_mapped_bytes, "peak_mapped_ratio": first.peak_mapped_bytes / peak_live,
        "driver_calls": first.driver_calls, "driver_calls_per_op": _per_op(first.driver_calls["total"], ops),
        "setup_driver_calls": first.setup_driver_calls,
        "modeled_h100_ns": modeled.modeled_ns, "modeled_ok": modeled.ok,
        "modeled_h100_ns_per_op": _per_op(modeled.modeled_ns, modeled.events_done),
        "modeled_replay_driver_calls": modeled.driver_calls,
    }
    at = f"at {first.capacity_bytes} B"
    checks = [replay_check(f"{at}, replay {i}", r, False) for i, r in enumerate(replays)]
    checks.append(replay_check(f"{at}, modeled replay", modeled, True))
    row["path_checked"] = summary(checks)
    if cpu:
        row.update(cpu_ns_per_op=statistics.median(r.ns_per_op for r in replays),
                   user_ns_per_op=statistics.median(_per_op(r.user_ns, r.events_done) or 0.0 for r in replays),
                   sys_ns_per_op=statistics.median(_per_op(r.sys_ns, r.events_done) or 0.0 for r in replays),
                   cpu_ns_per_op_repeats=[r.ns_per_op for r in replays],
                   replay_wall_s=[r.wall_ns / 1e9 for r in replays],
                   driver_calls_total_repeats=[r.driver_calls["total"] for r in replays])
    return row


def measure_at(compiled: Compiled, config: Any, capacity: int, peak_live: int, repeats: int, *,
               cpu: bool = True, host_limit: int | None = None) -> dict[str, Any]:
    """``repeats`` plain replays (counters from the first; CPU time, their median) and one with the
    h100 model; {"skipped": why} when the capacity is above the host memory limit."""
    try:
        plain = [replay_host(compiled, config, capacity, host_limit) for _ in range(max(1, repeats))]
    except HostMemoryLimit as e:
        return {"capacity_bytes": capacity, "skipped": str(e)}
    modeled = replay_host(compiled, config.replace(cost_model="h100"), capacity, host_limit)
    return _at(plain, modeled, peak_live, cpu=cpu)


def measure_trace(trace: trace_format.Trace, path: Path, config: Any, page_bytes: int, *, repeats: int,
                  capacity: int | None = None, host_limit: int | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every figure of one trace (module docstring, benchmarks/README.md)."""
    from vtalloc.allocator.config import MAX_SPACE_BYTES

    t_start = time.perf_counter()
    compiled = Compiled.of(trace)
    peak_live = trace.peak_live_bytes()
    if peak_live == 0:
        raise BenchError(f"{trace.name}: the trace allocates nothing")
    row: dict[str, Any] = {
        "name": trace.name, "path": str(path), "source": trace.source, "model": trace.model,
        "workload": trace.workload, "events": len(trace.events), "allocs": trace.num_allocs,
        "frees": trace.num_frees, "streams": trace.streams, "peak_live_bytes": peak_live,
        "peak_page_rounded_bytes": peak_page_rounded_bytes(trace), "page_bytes": page_bytes,
        "bound_bytes": bound_bytes(peak_live, page_bytes),
    }
    if capacity is not None:
        row["at_capacity"] = measure_at(compiled, config, capacity, peak_live, repeats, host_limit=host_limit)
        row["wall_s"] = time.perf_counter() - t_start
        return row
    t0 = time.perf_counter()
    try:
        found = search_min(lambda u: replay_host(compiled, config, u * page_bytes, host_limit).ok,
                           -(-peak_live // page_bytes), limit=MAX_SPACE_BYTES // page_bytes)
    except BenchError as e:  # HostMemoryLimit included
        row["min_capacity"] = {"error": str(e), "search_wall_s": time.perf_counter() - t0}
        found = None
    if found is not None:
        assert found.units is not None  # no deadline: the search always ends with an answer
        min_cap = found.units * page_bytes
        row["min_capacity"] = {
            "bytes": min_cap, "pages": found.units, "overhead_pct": (min_cap - peak_live) / peak_live * 100,
            "meets_bound": min_cap <= row["bound_bytes"], "search_wall_s": time.perf_counter() - t0,
            "tries": [{"capacity_bytes": u * page_bytes, "ok": ok} for u, ok in found.tries],
        }
        log(f"  {trace.name}: min capacity {min_cap} B ({row['min_capacity']['overhead_pct']:.2f}% over live), "
            f"{len(found.tries)} tries, {row['min_capacity']['search_wall_s']:.1f} s")
    at4 = -(-MEASURE_MULTIPLE * peak_live // page_bytes) * page_bytes
    row["at_4x"] = measure_at(compiled, config, at4, peak_live, repeats, host_limit=host_limit)
    if found is not None:
        row["at_min"] = measure_at(compiled, config, found.units * page_bytes, peak_live, 1, cpu=False,
                                   host_limit=host_limit)
    row["wall_s"] = time.perf_counter() - t_start
    return row


# -- the table ---------------------------------------------------------------------------------------

def _size(n: int | None) -> str:
    from vtalloc.allocator.config import format_size

    return "—" if n is None else format_size(n)


def _num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| model | peak live | page-rounded | min capacity (% over live) | meets bound | peak mapped / live at 4x "
           "| driver calls/op | modeled H100 µs/op | CPU ns/op |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        m = r.get("min_capacity")
        at = r.get("at_4x") or r.get("at_capacity") or {}
        if m is None:
            mincap, meets = "— (not searched)", "—"
        elif "error" in m:
            mincap, meets = f"— ({m['error'][:80]})", "—"
        else:
            mincap, meets = f"{_size(m['bytes'])} ({m['overhead_pct']:.2f}%)", "yes" if m["meets_bound"] else "**no**"
        modeled = at.get("modeled_h100_ns_per_op")
        cpu = _num(at.get("cpu_ns_per_op"), 0)
        if at.get("user_ns_per_op") is not None:  # the rest is mostly the host backend's kernel work
            cpu += f" (user {at['user_ns_per_op']:.0f})"
        if "skipped" in at:
            ratio = f"— (skipped: {_size(at['capacity_bytes'])} above the host memory limit)"
        else:
            ratio = f"{at['peak_mapped_ratio']:.3f}" + ("" if "at_4x" in r else f" (at {_size(at['capacity_bytes'])})")
            if not at["ok"]:
                ratio += " **OOM**"
        out.append(f"| {r['name']} | {_size(r['peak_live_bytes'])} | {_size(r['peak_page_rounded_bytes'])} | {mincap} "
                   f"| {meets} | {ratio} | {_num(at.get('driver_calls_per_op'), 3)} "
                   f"| {_num(None if modeled is None else modeled / 1000, 3)} | {cpu} |")
    return "\n".join(out)


# -- --compare ---------------------------------------------------------------------------------------

def _ratio(after: float | None, before: float | None) -> float | None:
    if after is None or before is None:
        return None
    if before == 0:
        return 1.0 if after == 0 else float("inf")
    return after / before


def compare(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, list[str]]:
    """The before/after table and the misses (empty: every "after" row meets the bounds)."""
    b_rows = {r["name"]: r for r in before.get("traces", [])}
    a_rows = {r["name"]: r for r in after.get("traces", [])}
    misses: list[str] = []
    out = ["| model | min capacity % over live (before → after) | peak mapped / live at 4x (before → after) "
           "| driver calls/op (before → after, ratio) | modeled H100 µs/op (before → after, ratio) | verdict |",
           "|---|---:|---:|---:|---:|---|"]
    for name in sorted(set(b_rows) | set(a_rows)):
        b, a = b_rows.get(name), a_rows.get(name)
        if a is None:
            misses.append(f"{name}: in BEFORE but not in AFTER")
            out.append(f"| {name} | | | | | **missing in after** |")
            continue
        bad: list[str] = []

        def usable(row: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
            x = (row or {}).get(key)
            return None if x is None or "error" in x or "skipped" in x else x

        am, a4 = usable(a, "min_capacity"), usable(a, "at_4x")
        bm, b4 = usable(b, "min_capacity"), usable(b, "at_4x")
        if am is None or a4 is None:
            why = [f"{k}: {(a.get(k) or {}).get('error') or (a.get(k) or {}).get('skipped') or 'absent'}"
                   for k, x in (("min_capacity", am), ("at_4x", a4)) if x is None]
            bad.append("after lacks figures (" + "; ".join(why)[:200] + ")")
        else:
            if am["bytes"] > a["bound_bytes"]:
                bad.append(f"min capacity {am['bytes']} B > bound {a['bound_bytes']} B")
            if not a4["ok"]:
                bad.append("OOM at 4x")
            if a4["peak_mapped_bytes"] > PEAK_MAPPED_LIMIT * a["peak_live_bytes"]:
                bad.append(f"peak mapped {a4['peak_mapped_ratio']:.3f} x live > {PEAK_MAPPED_LIMIT}")
        calls_r = mod_r = None
        if a4 is not None and b4 is not None:
            calls_r = _ratio(a4["driver_calls_per_op"], b4["driver_calls_per_op"])
            mod_r = _ratio(a4["modeled_h100_ns_per_op"], b4["modeled_h100_ns_per_op"])
            if calls_r is None or calls_r > REGRESSION_LIMIT:
                bad.append(f"driver calls/op x{_num(calls_r, 3)} of before (limit {REGRESSION_LIMIT})")
            if mod_r is None or mod_r > REGRESSION_LIMIT:
                bad.append(f"modeled time/op x{_num(mod_r, 3)} of before (limit {REGRESSION_LIMIT})")
        elif b4 is None:
            bad.append("BEFORE has no 4x figures for it: calls/op and modeled time cannot be compared")
        misses += [f"{name}: {m}" for m in bad]

        def pair(bv: Any, av: Any, fmt: Callable[[Any], str]) -> str:
            return f"{fmt(bv) if bv is not None else '—'} → {fmt(av) if av is not None else '—'}"

        pct = pair(bm and bm["overhead_pct"], am and am["overhead_pct"], lambda v: f"{v:.2f}%")
        mapped = pair(b4 and b4["peak_mapped_ratio"], a4 and a4["peak_mapped_ratio"], lambda v: f"{v:.3f}")
        calls = pair(b4 and b4["driver_calls_per_op"], a4 and a4["driver_calls_per_op"], lambda v: f"{v:.3f}")
        us = pair(b4 and b4["modeled_h100_ns_per_op"] and b4["modeled_h100_ns_per_op"] / 1000,
                  a4 and a4["modeled_h100_ns_per_op"] and a4["modeled_h100_ns_per_op"] / 1000, lambda v: f"{v:.3f}")
        verdict = "ok" if not bad else "**" + "; ".join(bad) + "**"
        out.append(f"| {name} | {pct} | {mapped} | {calls} (x{_num(calls_r, 3)}) | {us} (x{_num(mod_r, 3)}) "
                   f"| {verdict} |")
    return "\n".join(out), misses


# -- GPU mode: the device-agnostic body --------------------------------------------------------------

class Device(Protocol):
    """What the GPU replay needs of a device; tests pass a fake one."""

    def stream(self, number: int) -> Any: ...          # the stream for trace stream ``number`` (0: default)
    def alloc(self, size: int, stream: Any) -> Any: ...  # a handle; raises on OOM
    def free(self, handle: Any) -> None: ...           # called once per handle, in trace order
    def is_oom(self, error: BaseException) -> bool: ...
    def synchronize(self) -> None: ...
    def peaks(self) -> dict[str, Any]: ...             # peak_reserved_bytes, peak_allocated_bytes, ...


def replay_on_device(events: Sequence[tuple], device: Device) -> dict[str, Any]:
    """Replay a trace's events on ``device``, stopping at the first OOM; peaks are read after the
    replay (before the clean-up frees what is still live). Errors other than OOM propagate."""
    streams = {n: device.stream(n) for n in sorted({e[3] for e in events if e[0] == "a"})}
    live: dict[int, Any] = {}
    oom: dict[str, Any] | None = None
    done = 0
    t0 = time.perf_counter_ns()
    for k, e in enumerate(events):
        if e[0] == "a":
            try:
                live[e[1]] = device.alloc(e[2], streams[e[3]])
            except Exception as exc:  # noqa: BLE001 - the device says which errors are OOMs
                if not device.is_oom(exc):
                    raise
                oom = {"event": k, "size": e[2], "error": (str(exc).splitlines() or [""])[0][:300]}
                break
        else:
            device.free(live.pop(e[1]))
        done += 1
    device.synchronize()
    wall = time.perf_counter_ns() - t0
    peaks = device.peaks()
    for ident in list(live):
        device.free(live.pop(ident))
    device.synchronize()
    return {"ok": oom is None, "events_done": done, "oom": oom, "wall_s": wall / 1e9, **peaks}


class TorchDevice:
    """torch.empty(size, uint8, cuda) under torch.cuda.stream(s); a handle is the tensor, and
    dropping the last reference (the replay's) is the free."""

    def __init__(self, torch: Any, vt: Any = None) -> None:
        self.torch, self.vt = torch, vt

    def stream(self, number: int) -> Any:
        return self.torch.cuda.current_stream() if number == 0 else self.torch.cuda.Stream()

    def alloc(self, size: int, stream: Any) -> Any:
        torch = self.torch
        with torch.cuda.stream(stream):
            return torch.empty(size, dtype=torch.uint8, device="cuda")

    def free(self, handle: Any) -> None:
        del handle  # the caller held the other reference and dropped it: the tensor dies here

    def is_oom(self, error: BaseException) -> bool:
        oom = getattr(self.torch, "OutOfMemoryError", None) or self.torch.cuda.OutOfMemoryError
        return isinstance(error, oom)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def peaks(self) -> dict[str, Any]:
        cuda = self.torch.cuda
        torch_api: dict[str, Any] = {}
        try:
            torch_api = {"peak_reserved_bytes": cuda.max_memory_reserved(), "peak_allocated_bytes":
                         cuda.max_memory_allocated(),
                         "peak_requested_bytes": cuda.memory_stats().get("requested_bytes.all.peak")}
        except Exception as e:  # noqa: BLE001 - a pluggable allocator may not answer
            torch_api = {"error": str(e)[:200]}
        if self.vt is None:
            return {**torch_api, "stats_from": "torch.cuda"}
        s = self.vt.memory_stats()
        return {"peak_reserved_bytes": s["reserved_bytes.all.peak"],
                "peak_allocated_bytes": s["allocated_bytes.all.peak"],
                "peak_requested_bytes": s["requested_bytes.all.peak"], "stats_from": "vtalloc.allocator.torch",
                "torch_api": torch_api, "binding": self.vt.binding().kind}


def cuda_unavailable_reason() -> str | None:
    """Why torch cannot use a CUDA device here, or None when it can."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not importable: {e}"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable CUDA device"
    return None


def torch_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One replay in this (fresh) process under one allocator, capped at cfg["capacity"] bytes (None: uncapped)."""
    reason = cuda_unavailable_reason()
    if reason:
        return {"status": "no_cuda", "why": reason}
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    cap, vt = cfg.get("capacity"), None
    if cfg["allocator"] == "vtalloc":
        import vtalloc.allocator.torch as vt

        vt.enable(**cfg.get("options", {}), **({"capacity": cap} if cap is not None else {}))
    elif cap is not None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
    trace = trace_format.load(cfg["trace"])
    result = replay_on_device(trace.events, TorchDevice(torch, vt))
    return {"status": "ok", "allocator": cfg["allocator"], "capacity_bytes": cap, "total_memory_bytes": total,
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__, **result}


def run_torch_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if cfg["allocator"] == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        p = subprocess.run([sys.executable, __file__, "--torch-child", json.dumps(cfg)], capture_output=True,
                           text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "timeout_s": timeout}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return {"status": "error", "returncode": p.returncode, "error": "\n".join(lines[-8:])}


Runner = Callable[[dict[str, Any], float], dict[str, Any]]


def torch_uncapped(path: Path, allocator: str, options: dict[str, Any], *, timeout: float,
                   run: Runner | None = None) -> dict[str, Any]:
    """One uncapped replay under ``allocator``: its peaks (reserved, allocated, requested)."""
    cfg = {"trace": str(path), "allocator": allocator, "options": options, "capacity": None}
    return (run or run_torch_child)(cfg, timeout)


def torch_search(path: Path, allocator: str, peak_live: int, unit: int, options: dict[str, Any],
                 uncapped: dict[str, Any], *, deadline: float | None, timeout: float,
                 run: Runner | None = None) -> dict[str, Any]:
    """The smallest capacity (a multiple of ``unit``) with no OOM, each try in its own process: from
    peak live up, the uncapped peak reserved as the first guess, the device's memory as the limit."""
    base = {"trace": str(path), "allocator": allocator, "options": options}
    failures: list[dict[str, Any]] = []

    def fits(u: int) -> bool:
        r = (run or run_torch_child)({**base, "capacity": u * unit}, timeout)
        if r.get("status") != "ok":
            failures.append(r)
            raise BenchError(f"{allocator} at {u * unit} B: {r.get('status')}: {str(r.get('error', ''))[:300]}")
        return bool(r["ok"])

    guess = -(-uncapped["peak_reserved_bytes"] // unit)
    try:
        found = search_min(fits, -(-peak_live // unit), limit=uncapped["total_memory_bytes"] // unit, guess=guess,
                           deadline=deadline)
    except BenchError as e:
        return {"error": str(e), "child": failures[-1] if failures else None}
    return {"bytes": None if found.units is None else found.units * unit, "exact": found.exact,
            "largest_failing_bytes": None if found.largest_failing is None else found.largest_failing * unit,
            "overhead_pct": None if found.units is None else (found.units * unit - peak_live) / peak_live * 100,
            "resolution_bytes": unit, "tries": [{"capacity_bytes": u * unit, "ok": ok} for u, ok in found.tries]}


def torch_measure(path: Path, allocator: str, peak_live: int, unit: int, options: dict[str, Any], *,
                  deadline: float | None, timeout: float, run: Runner | None = None) -> dict[str, Any]:
    """Uncapped peaks, then the capacity search (when the uncapped replay finished)."""
    row: dict[str, Any] = {"allocator": allocator,
                           "uncapped": torch_uncapped(path, allocator, options, timeout=timeout, run=run)}
    if row["uncapped"].get("status") == "ok" and row["uncapped"].get("ok"):
        row["min_capacity"] = torch_search(path, allocator, peak_live, unit, options, row["uncapped"],
                                           deadline=deadline, timeout=timeout, run=run)
    return row


def resolution(spec: str, peak_live: int) -> int:
    """--resolution as bytes: a size, or a percent of peak live rounded up to 2 MiB (at least 2 MiB)."""
    from vtalloc.allocator.config import parse_size
    from vtalloc.allocator.errors import InvalidArgumentError

    try:
        if spec.endswith("%"):
            pct = float(spec[:-1])
            if not 0 < pct <= 100:
                raise UsageError(f"--resolution {spec}: a percent in (0, 100]")
            return max(2 * MiB, -(-int(peak_live * pct / 100) // (2 * MiB)) * 2 * MiB)
        return parse_size(spec, name="--resolution")
    except (InvalidArgumentError, ValueError) as e:
        raise UsageError(str(e) if isinstance(e, UsageError) else f"--resolution: {e}") from None


def torch_table(rows: list[dict[str, Any]]) -> str:
    out = ["| model | allocator | peak live | peak reserved (/ live) | peak allocated | min capacity (% over live) |",
           "|---|---|---:|---:|---:|---:|"]
    for t in rows:
        for r in t["allocators"]:
            u = r["uncapped"]
            if u.get("status") != "ok":
                out.append(f"| {t['name']} | {r['allocator']} | {_size(t['peak_live_bytes'])} "
                           f"| {u.get('status')} | | |")
                continue
            m = r.get("min_capacity") or {}
            if m.get("bytes") is not None:
                mincap = f"{_size(m['bytes'])} ({m['overhead_pct']:.2f}%)" + ("" if m["exact"] else " (upper bound)")
            else:
                mincap = m.get("error", "not found in time")[:60]
            peak = u["peak_reserved_bytes"]
            out.append(f"| {t['name']} | {r['allocator']} | {_size(t['peak_live_bytes'])} "
                       f"| {_size(peak)} ({peak / t['peak_live_bytes']:.3f}) | {_size(u['peak_allocated_bytes'])} "
                       f"| {mincap} |")
    return "\n".join(out)


# -- main --------------------------------------------------------------------------------------------

def _options(a: argparse.Namespace) -> dict[str, Any]:
    """The Config options the command line gives (sizes parsed: a bad one is a UsageError)."""
    from vtalloc.allocator.config import Config, parse_size
    from vtalloc.allocator.errors import InvalidArgumentError

    opts: dict[str, Any] = {}
    fields = {f.name for f in dataclasses.fields(Config)}
    try:
        for kv in a.config:
            key, sep, value = kv.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise UsageError(f"--config takes key=value, got {kv!r}")
            if key not in fields:
                raise UsageError(f"--config: unknown Config field {key!r} (fields: {', '.join(sorted(fields))})")
            if key in BENCH_OWNED:
                raise UsageError(f"--config {key}: {BENCH_OWNED[key]}")
            opts[key] = parse_size(value, name=key) if key in Config._SIZE_FIELDS else value
        for key in ("page_size", "small_threshold", "extent_size"):  # the flags win over --config
            value = getattr(a, key)
            if value is not None:
                opts[key] = parse_size(value, name="--" + key.replace("_", "-"))
        if a.evict_mode is not None:
            opts["evict_mode"] = a.evict_mode
    except InvalidArgumentError as e:
        raise UsageError(str(e)) from None
    return opts


def _host_config(opts: dict[str, Any]) -> tuple[Any, int]:
    """The Config and its page size (asked of a space built from it: a Config the core refuses is a UsageError)."""
    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.config import Config
    from vtalloc.allocator.errors import InvalidArgumentError

    try:
        config = Config(backend="host", **opts)
        with AddressSpace(config=config) as probe:
            return config, probe.page_bytes
    except InvalidArgumentError as e:
        raise UsageError(f"the Config is refused: {e}") from None


def _git_of(folder: Path) -> dict[str, Any] | None:
    """The commit of the git tree ``folder`` is in, and whether its tracked files were changed."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)

    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "tracked_changes": bool(status.stdout.strip())}


def _library() -> dict[str, Any] | None:
    """The native library VTALLOC_LIBRARY names (path, sha256, and the git commit of its folder if any)."""
    path = os.environ.get("VTALLOC_LIBRARY")
    if not path:
        return None
    info: dict[str, Any] = {"path": path}
    try:
        info["sha256"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        info["error"] = str(e)
    info["git"] = _git_of(Path(path).resolve().parent)
    return info


def _package() -> dict[str, Any]:
    """Where the vtalloc.allocator package that ran was imported from, and its git commit."""
    import vtalloc.allocator as pkg

    folder = Path(pkg.__file__).resolve().parent
    return {"path": str(folder), "git": _git_of(folder)}


def _provenance(date: str, argv: list[str]) -> dict[str, Any]:
    return {"machine": machine_info(), "git": git_info(), "date": date,
            "command": " ".join(["benchmarks/bench_trace.py", *argv]), "library": _library(),
            "package": _package()}


def _write(record: dict[str, Any], out_spec: str, backend: str, date: str) -> Path:
    out = Path(out_spec.format(backend=backend, date=date))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trace", action="append", default=[], metavar="PATH_OR_NAME",
                    help="a trace file, a folder of them (every *.json.gz), or a name in benchmarks/traces/ "
                         "(repeatable; default: every stored trace)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_REPEATS} timed repeat instead of {REPEATS}")
    ap.add_argument("--out", default=DEFAULT_OUT,
                    help=f"JSON path ({{backend}}, {{date}} filled in; default {DEFAULT_OUT})")
    ap.add_argument("--note", action="append", default=[], help="a note stored in the JSON (repeatable)")
    ap.add_argument("--label", default=None, help="stored in the JSON, e.g. before / after")
    ap.add_argument("--page-size", default=None, help="Config.page_size ('2MiB')")
    ap.add_argument("--small-threshold", default=None, help="Config.small_threshold")
    ap.add_argument("--extent-size", default=None, help="Config.extent_size")
    ap.add_argument("--evict-mode", default=None, choices=["auto", "copy", "mapped"], help="Config.evict_mode")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="any other Config field (repeatable), e.g. host_granularity=2MiB")
    ap.add_argument("--capacity", default=None, help="replay at this capacity only (no search, no 4x)")
    ap.add_argument("--host-memory-limit", default=None,
                    help=f"refuse host replays above this capacity "
                         f"(default {HOST_MEMORY_SHARE * 100:.0f}%% of MemAvailable)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="print the before/after table of two result files; exit 1 if AFTER misses a bound")
    ap.add_argument("--torch", action="store_true", help="GPU: replay through torch under native, expandable, vtalloc")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS), help="--torch: comma-separated subset")
    ap.add_argument("--resolution", default="1%",
                    help="--torch: the search's step, a size or a %% of peak live (default 1%%, at least 2 MiB)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="--torch: stop searching past this (each unfinished search keeps its bracket)")
    ap.add_argument("--timeout", type=float, default=120, help="--torch: seconds per process (default 120)")
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    return ap


def _main_compare(before: str, after: str) -> int:
    try:
        b, a = (json.loads(Path(p).read_text()) for p in (before, after))
    except (OSError, ValueError) as e:
        raise UsageError(f"--compare: {e}") from None
    text, misses = compare(b, a)
    print(f"before: {before} (label {b.get('label')!r}), after: {after} (label {a.get('label')!r})")
    print(text)
    if misses:
        print(f"\nFAILED: {len(misses)} miss(es):\n" + "\n".join(f"  - {m}" for m in misses))
        return 1
    print("\nevery after row meets the bounds")
    return 0


def _main_torch(a: argparse.Namespace, paths: list[Path], opts: dict[str, Any], date: str) -> int:
    allocators = [x for x in a.allocators.split(",") if x]
    if not allocators or set(allocators) - set(ALLOCATORS):
        raise UsageError(f"--allocators: choose from {', '.join(ALLOCATORS)}")
    resolution(a.resolution, 1)  # a bad one is a usage error before anything runs
    reason = cuda_unavailable_reason()
    if reason:
        print(f"needs a CUDA device: {reason}", file=sys.stderr)
        return 2
    deadline = None if a.max_seconds is None else time.monotonic() + a.max_seconds
    rows: list[dict[str, Any]] = []
    record = {"benchmark": "trace", "backend": "cuda", "label": a.label, "options": opts,
              "settings": {"allocators": allocators, "resolution": a.resolution, "max_seconds": a.max_seconds,
                           "timeout_s": a.timeout},
              "provenance": _provenance(date, a.argv), "traces": rows, "notes": a.note}
    out = None
    # Phase 1, every trace under every allocator uncapped (the peaks: cheap, one process each);
    # phase 2, the searches, each given an equal share of the time left (an earlier one's unused
    # share included). The record is written after each step: a run killed from outside keeps it.
    for path in paths:
        trace = trace_format.load(path)
        peak_live = trace.peak_live_bytes()
        row = {"name": trace.name, "path": str(path), "peak_live_bytes": peak_live,
               "resolution_bytes": resolution(a.resolution, peak_live),
               "peak_page_rounded_bytes": peak_page_rounded_bytes(trace), "allocators": []}
        rows.append(row)
        for alloc in allocators:
            if deadline is not None and time.monotonic() > deadline:
                u = {"status": "skipped", "why": "--max-seconds reached"}
            else:
                u = torch_uncapped(path, alloc, opts, timeout=a.timeout)
            row["allocators"].append({"allocator": alloc, "uncapped": u})
            print(f"  {trace.name} {alloc}: {u.get('status')}, peak reserved {u.get('peak_reserved_bytes')}",
                  flush=True)
            out = _write(record, a.out, "cuda", date)
    jobs = [(row, r) for row in rows for r in row["allocators"]
            if r["uncapped"].get("status") == "ok" and r["uncapped"].get("ok")]
    for k, (row, r) in enumerate(jobs):
        share = None if deadline is None else time.monotonic() + (deadline - time.monotonic()) / (len(jobs) - k)
        r["min_capacity"] = torch_search(Path(row["path"]), r["allocator"], row["peak_live_bytes"],
                                         row["resolution_bytes"], opts, r["uncapped"], deadline=share,
                                         timeout=a.timeout)
        print(f"  {row['name']} {r['allocator']}: min capacity {r['min_capacity'].get('bytes')}", flush=True)
        out = _write(record, a.out, "cuda", date)
    print(torch_table(rows))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # for the record's command line
    if a.torch_child:
        print(json.dumps(torch_child(json.loads(a.torch_child))))
        return 0
    try:
        if a.compare:
            return _main_compare(*a.compare)
        opts = _options(a)
        paths = [p for t in a.trace for p in resolve_trace(t)] if a.trace else trace_format.stored()
        if not paths:
            raise UsageError(f"no trace stored in {trace_format.TRACES_DIR}; name one with --trace")
        date = _dt.date.today().isoformat()
        if a.torch:
            return _main_torch(a, paths, opts, date)
        return _main_host(a, paths, opts, date)
    except (UsageError, trace_format.TraceError) as e:
        ap.error(str(e))
    except BenchError as e:
        print(f"bench_trace: {e}", file=sys.stderr)
        return 1
    return 2  # not reached: ap.error exits


def _main_host(a: argparse.Namespace, paths: list[Path], opts: dict[str, Any], date: str) -> int:
    from vtalloc.allocator.config import parse_size
    from vtalloc.allocator.errors import InvalidArgumentError

    config, page_bytes = _host_config(opts)
    try:
        capacity = None if a.capacity is None else parse_size(a.capacity, name="--capacity")
        if a.host_memory_limit is not None:
            host_limit = parse_size(a.host_memory_limit, name="--host-memory-limit")
        else:
            avail = mem_available_bytes()
            host_limit = None if avail is None else int(avail * HOST_MEMORY_SHARE)
    except InvalidArgumentError as e:
        raise UsageError(str(e)) from None
    traces = [(trace_format.load(p), p) for p in paths]  # every file validates before any replay
    repeats = QUICK_REPEATS if a.quick else REPEATS
    rows: list[dict[str, Any]] = []
    record = {"benchmark": "trace", "backend": "host", "label": a.label,
              "config": dataclasses.asdict(config), "page_bytes": page_bytes,
              "settings": {"repeats": repeats, "quick": a.quick, "capacity": capacity, "host_memory_limit": host_limit,
                           "measure_multiple": MEASURE_MULTIPLE, "bound": f"peak live + max({BOUND_PERCENT}% of peak "
                           f"live, {BOUND_PAGES} pages)", "page_rounding": "sizes > 1 MiB to 2 MiB, others to 512 B"},
              "provenance": _provenance(date, a.argv), "traces": rows, "notes": a.note}
    for trace, path in traces:
        print(f"{trace.name}: {len(trace.events)} events ...", flush=True)
        rows.append(measure_trace(trace, path, config, page_bytes, repeats=repeats, capacity=capacity,
                                  host_limit=host_limit))
        print(f"  {rows[-1]['name']}: {rows[-1]['wall_s']:.1f} s", flush=True)
        out = _write(record, a.out, "host", date)  # after each trace: an interrupted run keeps what it finished
    checks = [{**c, "row": f"{r['name']} {key} {c['row']}"} for r in rows for key in ("at_capacity", "at_4x", "at_min")
              if "path_checked" in r.get(key, {}) for c in r[key]["path_checked"]["checks"]]
    record["path_checked"] = summary(checks)
    out = _write(record, a.out, "host", date)
    print(table(rows))
    print(f"wrote {out}")
    if failed(checks):
        print("PATH CHECK FAILED: replays measured another path than they name:\n  " + "\n  ".join(failed(checks)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
