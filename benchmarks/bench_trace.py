"""bench_trace: replay real models' allocation traces (benchmarks/traces/) on vtalloc, and on a GPU
against PyTorch's own allocators.

Owns: the command line (host mode, ``--compare``, ``--torch`` and the ``--torch-child`` a GPU try
runs in), the Config it builds, the JSON record with its provenance, and ``--resolution``. The
parts are in benchmarks/lib/: the host replay and its figures (trace_replay.py: peak live,
page-rounded peak, min capacity and its bound, peak mapped, driver calls, modeled H100 driver time,
CPU time per op; the search is lib/capacity_search.py's, which the simulation of PyTorch's allocators
shares), the Markdown tables and ``--compare`` (trace_report.py: the gate an allocation-policy
change must pass), and the GPU mode (trace_gpu.py: the same trace through ``torch.empty`` / ``del``
under the native caching allocator, ``expandable_segments`` and vtalloc, each try in its own
process).
Invariants: every replay builds a fresh space (or, on a GPU, a fresh process) and closes it:
nothing is reused between tries, so a try's outcome depends on its capacity only; a replay stops
at its first OOM; frees follow the trace's order; nothing writes the bytes; no figure is printed
that was not measured in the run (a modeled H100 time is the cost model's prediction, and is
named so); the record is written after each trace (host) or step (GPU), so an interrupted run
keeps what it finished.

    python benchmarks/bench_trace.py                                  # every stored trace, default Config
    python benchmarks/bench_trace.py --trace resnet50 --quick --label after
    python benchmarks/bench_trace.py --trace bert --page-size 32MiB --config host_granularity=2MiB
    python benchmarks/bench_trace.py --trace resnet50 --capacity 6GiB  # one capacity, no search
    python benchmarks/bench_trace.py --compare before.json after.json # exit 1 if "after" misses a bound
    python benchmarks/bench_trace.py --torch --max-seconds 390        # GPU: native, expandable, vtalloc
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # the library (benchmarks/lib/) sits beside this file

from lib import trace_format  # noqa: E402
from lib.capacity_search import BenchError, search_min  # noqa: E402,F401 (search_min: tests use it from here)
from lib.path_check import failed, summary  # noqa: E402
# provenance at import, not inside _provenance(): tests load this file with the folder on sys.path
# only while it loads (helpers/benchmarks.py), so a later import of it failed run alone
from lib.provenance import git_info, machine_info  # noqa: E402
# The host replay, the tables and the GPU mode live in the library; the names tests use (and
# tests/test_oom_gpu.py's replay_on_device and TorchDevice) are this script's too.
from lib.trace_gpu import (  # noqa: E402,F401
    Device,
    TorchDevice,
    cuda_unavailable_reason,
    replay_on_device,
    run_torch_child,
    torch_child,
    torch_measure,
    torch_search,
    torch_uncapped,
)
from lib.trace_replay import (  # noqa: E402,F401
    BOUND_PAGES,
    BOUND_PERCENT,
    MEASURE_MULTIPLE,
    Compiled,
    HostMemoryLimit,
    Replay,
    bound_bytes,
    measure_at,
    measure_trace,
    page_rounded,
    peak_page_rounded_bytes,
    replay_check,
    replay_host,
)
from lib.trace_report import compare, table, torch_table  # noqa: E402

MiB = 1 << 20
REPEATS, QUICK_REPEATS = 3, 1
ALLOCATORS = ("native", "expandable", "vtalloc")
DEFAULT_OUT = "benchmarks/results/trace-{backend}-{date}.json"
# Config fields the bench sets itself: --config may not name them.
BENCH_OWNED = {"backend": "the bench replays on the host backend (--torch for a GPU)", "device": "host backend only",
               "capacity": "use --capacity", "cost_model": "the bench runs its own h100 cost-model replay"}


class UsageError(ValueError):
    """A bad command line: main() reports it and exits 2."""


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
                u = torch_uncapped(path, alloc, opts, timeout=a.timeout, run=run_torch_child)
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
                                         timeout=a.timeout, run=run_torch_child)
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
