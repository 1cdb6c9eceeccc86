"""trace_replay: one allocation trace replayed on a fresh host-backend space, and every figure of
it (bench_trace.py's host mode).

Owns: the page-rounded peak and the bound a policy must meet (``page_rounded``,
``peak_page_rounded_bytes``, ``bound_bytes``), the trace as the host loop wants it (``Compiled``),
one replay (``replay_host``: a tight ctypes loop over ``vta_malloc`` / ``vta_free``, its
``Replay``), the check that a replay took the malloc/free path (``replay_check``), the figures at
one capacity (``measure_at``) and of one trace (``measure_trace``: the smallest capacity with no
OOM, searched by capacity_search.py, and the figures at 4x peak live and at that minimum).
Invariants: every replay builds a fresh space and closes it, whatever happened: nothing is reused
between tries, so a try's outcome depends on its capacity only; a replay stops at its first OOM;
frees follow the trace's order; nothing writes the bytes; a capacity above the host memory limit
is refused (``HostMemoryLimit``) before any space is built; trace stream 0 is the space's default
stream, each other trace stream one host stream of the space (destroyed before the space closes).
"""

from __future__ import annotations

import ctypes
import dataclasses
import resource
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from lib import trace_format
from lib.capacity_search import BenchError, search_min
from lib.path_check import check, summary

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


class HostMemoryLimit(BenchError):
    """A host replay at a capacity above the host memory limit, refused before it starts."""


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
