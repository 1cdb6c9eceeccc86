"""bench_saved_offload: how much of what paged_activations asks to offload moves, on the allocation
orders of real models' training steps (the traces' saved marks, lib/trace_format.py ``saved``).

Owns: the replay of one trace with saved marks on a fresh host-backend ``AddressSpace`` at default
settings (capacity MULTIPLE x peak live, a host pool as large, ``evict_mode="copy"``): its
allocations and frees in order and, after each saved mark's event, ``set_evictable`` on the
allocation saved and paged_activations' evict-behind rule over the saved allocations; the
figures of one (trace, budget) pair (saved tensors and bytes, bytes asked, moved, kept resident
and where), the JSON record, its Markdown table, and the CLI.

The rule, as ``PagedActivations._evict_behind`` runs it for ``DevicePager`` (CUDA tensors paged in
place, where a saved tensor's neighbours on a page are whatever torch placed there): the saved
allocations in the order of their first mark; the resident saved bytes are the requested bytes
of those saved, live and not offloaded; at each mark, while they exceed the budget (a share of
the trace's saved bytes), the oldest one still resident is offloaded (not the one this mark
saved). ``offload()`` returns the bytes of it now away: they are "moved"; its block's bytes are
"asked" (once per allocation; the block is ``AddressSpace.allocations()``' ``size_bytes``, the
unit ``offload()`` counts in). An ``InvalidArgumentError`` (every page of it shared with an
allocation not marked evictable) moves nothing; the allocation stays counted resident and is
tried again at later marks, as paged_activations does; one partly moved stays counted resident
for the bytes it kept, and is offloaded again at later marks while the resident bytes exceed the
budget, as paged_activations does (the neighbour that pinned its page may be gone). "Moved" is
what was away at the last offload of it. Where the bytes kept stay is read from
``AddressSpace.pages()`` at its last offload (or first refusal): on a page that an allocation not marked evictable
shares ("page"; of those, the pages where all such are of at most TINY bytes, the host-only
scalars of a CPU trace), or on a page of a handle (an extent) that one shares elsewhere
("handle"); any other resident byte is "elsewhere", and bytes neither away nor on a resident
page "unexplained" (both 0 when the engine keeps only what docs/eviction.md says it keeps).
``--drop-up-to`` replays a what-if: the trace without its allocations of at most that many bytes.
Invariants: nothing here decides what may move: every byte counted as moved is one ``offload()``
reported; saved allocations are never restored (nothing writes in a replay, and freeing an
offloaded allocation is legal); a mark of an allocation already saved adds no bytes (counted as
a repeat: paged_activations would count the storage again); every space is closed, its host
streams destroyed; a full host pool (``HostPoolExhaustedError``) is a BenchError, not a figure;
each row checks it took that path and no other (``replay_check``: copy mode, the bytes counted as
moved evicted by the engine, nothing restored, no pressure eviction or OOM; ``path_check`` per
row, ``path_checked`` in the record), and a miss makes the script exit 1 naming the row.

    python benchmarks/bench_saved_offload.py                          # every stored trace, shares 0.25, 0, 0.5
    python benchmarks/bench_saved_offload.py --trace bert --budget-share 0.1
    python benchmarks/bench_saved_offload.py --trace /tmp/heldout2 --out /tmp/saved_offload-heldout.json
    python benchmarks/bench_saved_offload.py --drop-up-to 8 --out /tmp/saved_offload-no-scalars.json  # what-if
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # trace_format and provenance sit beside this file

from lib import trace_format  # noqa: E402
from lib.path_check import check, failed, summary  # noqa: E402
from lib.provenance import git_info, machine_info  # noqa: E402

MiB = 1 << 20
MULTIPLE = 4                       # capacity: this many times the trace's peak live bytes
DEFAULT_SHARES = (0.25, 0.0, 0.5)  # budget shares run by default; the first is the default setting
REQUIRED = 0.99                    # moved / asked that paged_activations must reach
TINY = 8                           # bytes: CPU-only 0-dim scalars and step counters (benchmarks/traces/README.md)
DEFAULT_OUT = "benchmarks/results/saved_offload-host-{date}.json"


class UsageError(ValueError):
    """A bad command line: main() reports it and exits 2."""


class BenchError(RuntimeError):
    """A replay that cannot give its figures (a trace without marks, a host pool too small)."""


@dataclasses.dataclass
class Saved:
    """One saved allocation of the replay."""

    ident: int
    address: int
    nbytes: int                 # requested: what the budget counts
    block: int | None = None    # its block's bytes in the space, learned when first asked
    state: str = "resident"     # resident | offloaded | freed
    asked: bool = False
    moved: int = 0
    kept: dict[str, int] = dataclasses.field(default_factory=dict)  # where the bytes not moved stay


def _kept_where(space: Any, s: Saved, evictable: set[int], size_at: dict[int, int]) -> dict[str, int]:
    """The block's bytes on resident pages, by why they stayed: a page shared with an allocation
    not marked evictable ("page"; "page_tiny" too when every such one on it is of at most TINY
    bytes), another page of its handle (an extent: the pages() records of one physical handle
    share its page_id) shared with one ("handle"), or neither ("other")."""
    assert s.block is not None
    out = {"page": 0, "page_tiny": 0, "handle": 0, "other": 0}
    start, end = s.address, s.address + s.block
    pages = [p for p in space.pages() if p.address is not None and p.state == "allocated"]
    pinned_handles = {p.page_id for p in pages if any(a != s.address and a not in evictable for a in p.allocations)}
    for p in pages:
        if p.address >= end or p.address + space.page_bytes <= start:
            continue
        n = min(end, p.address + space.page_bytes) - max(start, p.address)
        pins = [a for a in p.allocations if a != s.address and a not in evictable]
        if pins:
            out["page"] += n
            out["page_tiny"] += n if all(size_at[a] <= TINY for a in pins) else 0
        else:
            out["handle" if p.page_id in pinned_handles else "other"] += n
    return out


def _fill_blocks(space: Any, saved: Sequence[Saved]) -> None:
    """Learn the block size of every live saved allocation that lacks it (one allocations() call)."""
    by_address = {r.address: r.size_bytes for r in space.allocations()}
    for s in saved:
        if s.block is None and s.state != "freed":
            s.block = by_address[s.address]


def without_small(trace: trace_format.Trace, up_to: int) -> trace_format.Trace:
    """``trace`` without its allocations of at most ``up_to`` bytes (ids renumbered, marks kept):
    a what-if for the host-only scalars a CUDA step would not allocate."""
    if up_to <= 0:
        return trace
    keep = [e for e in trace.events if e[0] == "a" and e[2] > up_to]
    new_id = {e[1]: k for k, e in enumerate(keep)}
    events, index_of = [], {}
    for i, e in enumerate(trace.events):
        if e[1] in new_id:
            events.append(("a", new_id[e[1]], e[2], e[3]) if e[0] == "a" else ("f", new_id[e[1]]))
        index_of[i] = len(events) - 1
    saved = tuple((index_of[i], new_id[ident]) for i, ident in trace.saved)
    return dataclasses.replace(trace, events=tuple(events), saved=trace_format.validate_saved(saved, tuple(events)))


def replay(trace: trace_format.Trace, share: float) -> dict[str, Any]:
    """Replay ``trace`` with its saved marks, the budget ``share`` x its saved bytes; the row's figures."""
    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.errors import HostPoolExhaustedError, InvalidArgumentError

    if not trace.saved:
        raise BenchError(f"{trace.name}: the trace has no saved marks (record it again: record_trace.py)")
    sizes = trace.sizes()
    first_marks = dict.fromkeys(ident for _, ident in trace.saved)
    saved_bytes = sum(sizes[i] for i in first_marks)
    budget = int(share * saved_bytes)
    peak = trace.peak_live_bytes()
    capacity = MULTIPLE * peak
    marks_at: dict[int, list[int]] = {}
    for index, ident in trace.saved:
        marks_at.setdefault(index, []).append(ident)
    t0 = time.perf_counter()
    space = AddressSpace(backend="host", capacity=capacity, host_capacity=capacity, evict_mode="copy")
    made: list[int] = []
    addr: dict[int, int] = {}
    saved: dict[int, Saved] = {}       # by trace id, in order of first mark
    resident: dict[int, Saved] = {}    # saved, live, not offloaded: in order of first mark
    evictable: set[int] = set()        # addresses of live saved allocations
    size_at: dict[int, int] = {}       # address -> requested bytes, of every live allocation
    resident_bytes = repeats = offload_calls = refusals = 0
    try:
        stream_of = {0: 0}
        for st in trace.streams:
            if st:
                stream_of[st] = space._create_stream()
                made.append(stream_of[st])
        for i, e in enumerate(trace.events):
            if e[0] == "a":
                addr[e[1]] = space.malloc(e[2], stream_of[e[3]])
                size_at[addr[e[1]]] = e[2]
            else:
                s = saved.get(e[1])
                if s is not None:
                    if s.state == "resident" or (s.state == "offloaded" and s.ident in resident):
                        resident_bytes -= s.nbytes - min(s.moved, s.nbytes)
                        del resident[e[1]]
                    s.state = "freed"
                    evictable.discard(s.address)
                a = addr.pop(e[1])
                del size_at[a]
                space.free(a)
            for ident in marks_at.get(i, ()):
                if ident in saved:
                    repeats += 1
                else:
                    s = saved[ident] = resident[ident] = Saved(ident, addr[ident], sizes[ident])
                    space.set_evictable(s.address)
                    evictable.add(s.address)
                    resident_bytes += s.nbytes
                for old in list(resident.values()):  # paged_activations' _evict_behind, oldest first
                    if resident_bytes <= budget:
                        break
                    if old.ident == ident:
                        continue
                    if old.block is None:
                        _fill_blocks(space, list(resident.values()))
                    first = not old.asked
                    old.asked = True
                    offload_calls += 1
                    try:
                        moved = space.offload(old.address)
                    except InvalidArgumentError:
                        refusals += 1
                        if first:
                            old.kept = _kept_where(space, old, evictable, size_at)
                        continue
                    except HostPoolExhaustedError as exc:
                        raise BenchError(f"{trace.name}: host pool of {capacity} B full: {exc}") from None
                    was = min(old.moved, old.nbytes)
                    old.moved = moved
                    old.state = "offloaded"
                    old.kept = _kept_where(space, old, evictable, size_at) if old.moved < (old.block or 0) else {}
                    resident_bytes -= min(old.moved, old.nbytes) - was
                    if old.moved >= (old.block or 0):
                        del resident[old.ident]  # all of it away: not tried again
        space.synchronize()
        stats = space.stats()
        page = space.page_bytes
        active_mode = space.evict_mode
        for ident in sorted(addr):  # clean up: a stream with a live allocation cannot be destroyed
            space.free(addr[ident])
        for st in made:
            space._destroy_stream(st)
    finally:
        space.close()
    asked = [s for s in saved.values() if s.asked]
    asked_bytes = sum(s.block or 0 for s in asked)
    moved_bytes = sum(s.moved for s in asked)
    kept = {k: sum(s.kept.get(k, 0) for s in asked) for k in ("page", "page_tiny", "handle", "other")}
    small = [s for s in asked if (s.block or 0) < page]
    return {
        "name": trace.name, "budget_share": share, "budget_bytes": budget, "peak_live_bytes": peak,
        "capacity_bytes": capacity, "saved_marks": len(trace.saved), "repeat_marks": repeats,
        "saved_tensors": len(saved), "saved_bytes": saved_bytes, "asked_tensors": len(asked),
        "asked_bytes": asked_bytes, "moved_bytes": moved_bytes,
        "moved_share": moved_bytes / asked_bytes if asked_bytes else None,
        "kept_bytes": asked_bytes - moved_bytes, "kept_on_shared_page_bytes": kept["page"],
        "kept_on_shared_handle_bytes": kept["handle"], "kept_elsewhere_bytes": kept["other"],
        "kept_on_page_pinned_by_tiny_only_bytes": kept["page_tiny"],  # of kept_on_shared_page_bytes
        "kept_unexplained_bytes": asked_bytes - moved_bytes - kept["page"] - kept["handle"] - kept["other"],
        "partly_kept_tensors": sum(1 for s in asked if 0 < s.moved < (s.block or 0)),
        "never_moved_tensors": sum(1 for s in asked if s.moved == 0),
        "page_bytes": page, "asked_under_a_page_tensors": len(small),  # blocks smaller than one page
        "asked_under_a_page_bytes": sum(s.block or 0 for s in small),
        "moved_under_a_page_bytes": sum(s.moved for s in small),
        "offload_calls": offload_calls, "refusals": refusals,
        "pressure_evictions": stats.pressure_evictions, "ooms": stats.num_ooms,
        "peak_mapped_bytes": stats.peak_mapped_bytes, "wall_s": round(time.perf_counter() - t0, 2),
        "meets_requirement": None if not asked_bytes else moved_bytes >= REQUIRED * asked_bytes,
        "path_check": replay_check(f"{trace.name} budget {share:g}", active_mode, stats.as_dict(), moved_bytes,
                                   offload_calls),
    }


def replay_check(row: str, active_mode: str, stats: dict[str, Any], moved_bytes: int,
                 offload_calls: int = 0) -> dict[str, Any]:
    """The replay took paged_activations' evict-behind path, no other: copy mode as set; every byte
    counted as moved was evicted by the engine (bytes_evicted_total covers it: an allocation offloaded
    again counts its bytes again there); nothing restored (nothing is read back in a replay); no
    eviction under memory pressure and no OOM (at 4x peak live, a pressure eviction would move bytes
    the rule did not ask for). ``offload_calls`` is recorded, not checked: a row whose resident saved
    bytes never exceeded its budget asks nothing (0 calls) and says so in its table ("-")."""
    return check(row, "evict-behind offload (copy mode)",
                 {"evict_mode": "copy", "bytes_evicted_total": {"min": moved_bytes}, "restores": 0,
                  "pressure_evictions": 0, "num_ooms": 0},
                 {"evict_mode": active_mode, **{k: stats[k] for k in ("bytes_evicted_total", "restores",
                                                                      "pressure_evictions", "num_ooms")},
                  "offload_calls": offload_calls})


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:,.1f}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = ("| trace | budget | saved tensors | saved MiB | asked MiB | moved MiB | moved/asked "
            f"| kept: shared page MiB (pinned by <= {TINY} B only) | kept: shared handle MiB | never moved | >= 99% |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        share = "-" if r["moved_share"] is None else f"{100 * r['moved_share']:.2f}%"
        meets = {True: "yes", False: "**no**", None: "-"}[r["meets_requirement"]]
        lines.append(f"| {r['name']} | {r['budget_share']:g} | {r['saved_tensors']:,} | {_mib(r['saved_bytes'])} "
                     f"| {_mib(r['asked_bytes'])} | {_mib(r['moved_bytes'])} | {share} "
                     f"| {_mib(r['kept_on_shared_page_bytes'])} ({_mib(r['kept_on_page_pinned_by_tiny_only_bytes'])}) "
                     f"| {_mib(r['kept_on_shared_handle_bytes'])} "
                     f"| {r['never_moved_tensors']:,} | {meets} |")
    return "\n".join(lines)


def resolve(spec: str) -> list[Path]:
    """A trace file, a folder of them (every *.json.gz), or a name in benchmarks/traces/."""
    try:
        return trace_format.resolve(spec)
    except trace_format.TraceNotFound as e:
        raise UsageError(str(e)) from None


def library() -> dict[str, Any]:
    """The native library the replays load: its path and sha256 (the C++ core changes under the Python)."""
    from vtalloc.allocator import _native

    path = Path(_native.load()._name)
    return {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trace", action="append", default=[], metavar="PATH_DIR_OR_NAME",
                    help="a trace file, a folder of traces, or a name in benchmarks/traces/ (repeatable; "
                    "default: every stored trace)")
    ap.add_argument("--budget-share", action="append", type=float, default=[], metavar="SHARE",
                    help="budget as a share of the trace's saved bytes (repeatable; default: "
                    f"{', '.join(f'{s:g}' for s in DEFAULT_SHARES)}; {DEFAULT_SHARES[0]:g} is the default setting)")
    ap.add_argument("--drop-up-to", type=int, default=0, metavar="BYTES",
                    help=f"a what-if: replay without the allocations of at most BYTES (e.g. {TINY}: the host-only "
                    "scalars a CUDA step would not allocate; default 0, none)")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON path ({{date}} filled in; default {DEFAULT_OUT})")
    ap.add_argument("--note", action="append", default=[], help="a note stored in the JSON (repeatable)")
    a = ap.parse_args(argv)
    shares = a.budget_share or list(DEFAULT_SHARES)
    try:
        if any(not 0 <= s <= 1 for s in shares):
            raise UsageError("--budget-share takes a share from 0 to 1")
        paths = [p for spec in a.trace for p in resolve(spec)] if a.trace else trace_format.stored()
        traces = [without_small(trace_format.load(p), a.drop_up_to) for p in paths]  # all validate first
    except (UsageError, trace_format.TraceError) as e:
        ap.error(str(e))
    date = _dt.date.today().isoformat()
    rows: list[dict[str, Any]] = []
    record = {"benchmark": "saved_offload", "backend": "host",
              "settings": {"capacity": f"{MULTIPLE} x peak live", "host_capacity": "the capacity",
                           "evict_mode": "copy", "budget_shares": shares, "required_moved_share": REQUIRED,
                           "dropped_allocations_up_to_bytes": a.drop_up_to},
              "provenance": {"machine": machine_info(), "git": git_info(), "date": date,
                             "command": " ".join(["benchmarks/bench_saved_offload.py", *(argv or sys.argv[1:])]),
                             "library": library()},
              "traces": [str(p) for p in paths], "rows": rows, "notes": a.note}
    out = Path(a.out.format(date=date))
    try:
        for trace in traces:
            for share in shares:
                rows.append(replay(trace, share))
                print(f"  {trace.name} budget {share:g}: {rows[-1]['wall_s']} s", file=sys.stderr, flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(record, indent=1) + "\n")  # after each row: an interrupted run keeps it
    except BenchError as e:
        print(f"bench_saved_offload: {e}", file=sys.stderr)
        return 1
    checks = [r["path_check"] for r in rows]
    record["path_checked"] = summary(checks)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(table(rows))
    print(f"wrote {out}")
    if failed(checks):
        print("PATH CHECK FAILED: rows measured another path than they name:\n  " + "\n  ".join(failed(checks)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
