"""trace_report: the Markdown tables of bench_trace.py's records, and ``--compare`` of two of them
(the gate an allocation-policy change must pass).

Owns: ``table`` (one host record's rows), ``torch_table`` (a ``--torch`` record's rows),
``compare`` (before against after: the table and the misses) and its limits
(``PEAK_MAPPED_LIMIT``, ``REGRESSION_LIMIT``).
Invariants: pure (reads records, measures nothing); a figure a record lacks is shown as "—", never
made up; an "after" row misses when its min capacity is above its bound, it ran out of memory at
4x, its peak mapped at 4x exceeds the limit, or its driver calls or modeled time per op grew past
the regression limit (or cannot be compared).
"""

from __future__ import annotations

from typing import Any, Callable

# --compare: an "after" row misses when...
PEAK_MAPPED_LIMIT = 1.25   # ... peak mapped at 4x > 1.25 x peak live
REGRESSION_LIMIT = 1.10    # ... calls/op or modeled time/op > 1.1 x before


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
