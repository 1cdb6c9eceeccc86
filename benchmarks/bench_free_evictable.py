"""What one free costs while its allocation is evictable, by size (host backend).

While any allocation was evictable, free once walked the freed range page by page to drop each
page from the eviction engine's LRU (97 -> 454 ns at 64 MiB, about 3 us at 512 MiB on the
development machine). The LRU now keeps runs of pages and drops a freed allocation's interior in
one step (docs/design.md). This times one raw ``vta_free`` (a ctypes call, a Python timer around
it) of one allocation, evictable or not, at each size, and checks the path it names: the LRU
entries one evictable free touches (the test-only counter) must not grow with the size.

Owns: the timing loop, its JSON (``benchmarks/results/free_evictable-host-{date}.json`` by
default) and the path check.
Invariants: host backend only; each size gets its own space; the first ``--warmup`` frees are
dropped; exits 1 when an evictable free touched more than 3 LRU entries at any size (the page
walk is back), naming the sizes.

    python benchmarks/bench_free_evictable.py                 # 2, 64, 512 MiB, 300 timed frees each
    python benchmarks/bench_free_evictable.py --quick         # 2 and 64 MiB, 30 frees
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path

from lib.path_check import check, failed, summary
from lib.provenance import git_info, machine_info

from vtalloc.allocator import AddressSpace

MiB = 1 << 20


def measure(size: int, evictable: bool, reps: int, warmup: int) -> dict:
    """Median, p10 and p90 ns of one vta_free, and the LRU entries the timed frees touched each."""
    with AddressSpace(backend="host", capacity=size + 4 * MiB) as space:
        lib, handle = space._lib, space._h()
        times, touched = [], []
        for i in range(warmup + reps):
            a = space.malloc(size)
            if evictable:
                space.set_evictable(a)
            before = space._victim_counters()[1]
            t0 = time.perf_counter_ns()
            status = lib.vta_free(handle, a)
            t1 = time.perf_counter_ns()
            if status != 0:
                raise RuntimeError(f"vta_free returned {status} for a {size}-byte allocation")
            if i >= warmup:
                times.append(t1 - t0)
                touched.append(space._victim_counters()[1] - before)
        times.sort()
        return {"size_bytes": size, "evictable": evictable, "n": reps, "free_ns_median": statistics.median(times),
                "free_ns_p10": times[len(times) // 10], "free_ns_p90": times[(len(times) * 9) // 10],
                "lru_entries_touched_per_free": max(touched)}


MAX_LRU_ENTRIES_PER_FREE = 3  # its first page, its last page (either may be shared), one range cut


def path_check(rows: list[dict]) -> dict:
    """Every evictable free touches at most MAX_LRU_ENTRIES_PER_FREE LRU entries, whatever its
    size (the page walk touched one per page: 32 at 64 MiB, 256 at 512 MiB): lib/path_check.py's
    record for the run."""
    return summary(check(f"evictable free {r['size_bytes'] // MiB} MiB", "LRU runs (no page walk)",
                         {"lru_entries_touched_per_free": {"max": MAX_LRU_ENTRIES_PER_FREE}},
                         {"lru_entries_touched_per_free": r["lru_entries_touched_per_free"]})
                   for r in rows if r["evictable"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 and 64 MiB, 30 timed frees")
    ap.add_argument("--reps", type=int, default=None, help="timed frees per row (default 300; --quick 30)")
    ap.add_argument("--warmup", type=int, default=100, help="untimed frees first (default 100)")
    ap.add_argument("--out", default="benchmarks/results/free_evictable-host-{date}.json")
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args(argv)
    reps = a.reps if a.reps is not None else (30 if a.quick else 300)
    if reps < 1 or a.warmup < 0:
        ap.error("--reps must be at least 1 and --warmup at least 0")
    sizes = (2 * MiB, 64 * MiB) if a.quick else (2 * MiB, 64 * MiB, 512 * MiB)
    rows = [measure(size, evictable, reps, 10 if a.quick else a.warmup) for size in sizes for evictable in (True, False)]
    date = _dt.date.today().isoformat()
    record = {"benchmark": "free_evictable", "backend": "host",
              "provenance": {"machine": machine_info(), "git": git_info(), "date": date,
                             "command": " ".join([Path(sys.argv[0]).as_posix()] + (argv if argv is not None else sys.argv[1:]))},
              "notes": a.note, "rows": rows, "path_checked": path_check(rows)}
    out = Path(a.out.format(date=date))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        print(f"{r['size_bytes'] // MiB:>4} MiB {'evictable' if r['evictable'] else 'plain    '}: "
              f"{r['free_ns_median']:>8.0f} ns per free (p10 {r['free_ns_p10']}, p90 {r['free_ns_p90']}), "
              f"{r['lru_entries_touched_per_free']} LRU entries touched")
    print(f"wrote {out}")
    if not record["path_checked"]["passed"]:
        print("path check failed:\n  " + "\n  ".join(failed(record["path_checked"]["checks"])), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
