"""What the service commands print: versioned JSON documents and the rich tables made from them.

Owns: the ``--json`` schemas (each document has ``"schema": "vtalloc.<name>/v<N>"``; a field is
never renamed or given a new meaning within a version, only added) and the tables. Pure
functions: messages or records in, dicts or tables out; no I/O, no RPC. Tables are built
from the JSON documents, so both always say the same thing. Units: bytes, seconds, pages.
"""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from vtalloc.allocator.config import format_size
from vtalloc.allocator.stats import fragmentation

from .layout import Column, fit

__all__ = [
    "STATS_SCHEMA", "PROC_SCHEMA", "PAGES_SCHEMA", "QUOTA_SCHEMA", "HEALTH_SCHEMA", "EVICT_SCHEMA",
    "stats_doc", "pages_doc", "quota_doc", "proc_doc", "stats_tables", "pages_tables", "quota_tables",
    "proc_tables", "fragmentation", "rounding_note",
]

STATS_SCHEMA = "vtalloc.stats/v1"
PROC_SCHEMA = "vtalloc.proc-stats/v1"
PAGES_SCHEMA = "vtalloc.pages/v1"
QUOTA_SCHEMA = "vtalloc.quota/v1"
HEALTH_SCHEMA = "vtalloc.health/v1"
EVICT_SCHEMA = "vtalloc.evict/v1"


def rounding_note(option: str, given: str, requested: int, actual: int, page_bytes: int) -> str | None:
    """A warning for stderr when a size option was not taken as written (None when it was)."""
    if actual == requested:
        return None
    if actual == requested - requested % page_bytes:
        how = f"is not a whole number of {format_size(page_bytes)} pages: rounded down to"
    else:
        how = "is not what the backend gives:"
    return f"warning: {option} {given} ({requested} bytes) {how} {format_size(actual)} ({actual} bytes, " \
           f"{actual // page_bytes} page{'' if actual == page_bytes else 's'})"


def _quota(q: Any) -> dict[str, Any]:
    return {"principal": q.principal, "min_bytes": q.min_bytes, "max_bytes": q.max_bytes}


def _device(d: Any, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    page = d.page_bytes
    active = sum(s["active_bytes"] for s in sessions if s["reported"])
    mapped = sum(s["mapped_bytes"] for s in sessions if s["reported"])
    evicted = sum(s["evicted_bytes"] for s in sessions if s["reported"])
    return {
        "backend": d.backend, "device": d.device, "page_bytes": page,
        "capacity_pages": d.capacity_pages, "capacity_bytes": d.capacity_pages * page,
        "leased_pages": d.leased_pages, "leased_bytes": d.leased_pages * page,
        "delivering_pages": d.delivering_pages,
        "free_pages": d.free_pages, "free_bytes": d.free_pages * page,
        # held by live clients of a previous daemon on this socket: not leasable until they exit
        "inherited_pages": d.inherited_pages, "inherited_bytes": d.inherited_pages * page,
        "inherited_processes": d.inherited_processes,
        "evicted_pages": d.evicted_pages, "evicted_bytes": d.evicted_bytes,
        "paused_bytes": d.paused_bytes,  # clients' allocations in paused regions (docs/regions.md)
        "host_capacity_bytes": d.host_capacity_bytes,
        "fragmentation": fragmentation(active, mapped, evicted),
    }


def _report(r: Any, page: int) -> dict[str, Any]:
    return {
        "allocated_bytes": r.allocated_bytes, "active_bytes": r.active_bytes, "mapped_bytes": r.mapped_bytes,
        "cached_bytes": r.cached_bytes, "resident_pages": r.pages_resident, "resident_bytes": r.pages_resident * page,
        "cached_pages": r.pages_cached,
        "unmapped_pages": r.pages_free, "evicted_pages": r.evicted_pages, "evicted_bytes": r.evicted_bytes,
        "evictions_total": r.evictions_total, "restores_total": r.restores_total, "ooms_total": r.ooms_total,
        "fragmentation": fragmentation(r.active_bytes, r.mapped_bytes, r.evicted_bytes),
        "paused_bytes": r.paused_bytes,
        "regions": [{"tag": x.tag, "bytes": x.bytes, "paused_bytes": x.paused_bytes, "host_bytes": x.host_bytes}
                    for x in r.regions],
    }


def _session(s: Any, page: int) -> dict[str, Any]:
    i = s.info
    doc = {
        "session_id": i.session_id, "pid": i.pid, "uid": i.uid, "principal": i.principal, "age_s": s.age_s,
        "leased_pages": i.leased_pages, "leased_bytes": i.leased_pages * page,
        "delivering_pages": s.delivering_pages, "quota": _quota(i.quota),
        "reported": s.reported, "report_age_s": s.report_age_s if s.reported else None,
        "evictions_per_s": s.evictions_per_s, "restores_per_s": s.restores_per_s,
        "evict_requests": s.evict_requests, "evict_pages_asked": s.evict_pages_asked,
        "evict_pages_returned": s.evict_pages_returned, "deadline_misses": s.deadline_misses,
        "quota_rejections": s.quota_rejections, "leases": s.leases, "pages_leased": s.pages_leased,
        "pages_returned": s.pages_returned,
    }
    doc.update(_report(s.report, page))
    return doc


def stats_doc(msg: Any, *, now: float | None = None) -> dict[str, Any]:
    """``vtalloc stats --json`` from a NodeStats message."""
    page = msg.device.page_bytes
    sessions = [_session(s, page) for s in msg.sessions]
    return {
        "schema": STATS_SCHEMA,
        "time_unix": time.time() if now is None else now,
        "daemon": {"version": msg.version, "uptime_s": msg.uptime_s},
        "devices": [_device(msg.device, sessions)],
        "sessions": sessions,
        "principals": [{**_quota(p.quota), "sessions": p.sessions, "leased_pages": p.leased_pages,
                        "leased_bytes": p.leased_pages * page, "evicted_bytes": p.evicted_bytes,
                        "quota_rejections": p.quota_rejections} for p in msg.principals],
        "counters": {f.name: getattr(msg.counters, f.name) for f in msg.counters.DESCRIPTOR.fields},
        "admin_view": msg.admin_view,
        "hidden_sessions": msg.hidden_sessions,
        "observers": msg.observers,
    }


# PageUse numbers (pages.proto) -> names: what the holding client does with the page.
_USES = {1: "resident", 2: "cached", 3: "unmapped", 4: "in_flight"}


def pages_doc(msg: Any) -> dict[str, Any]:
    """``vtalloc pages --json`` from a PageMap message."""
    names = {1: "delivering", 2: "leased"}
    sessions = [{"session_id": s.session_id, "principal": s.principal, "pid": s.pid, "reported": s.reported,
                 **_report(s.report, msg.device.page_bytes)} for s in msg.sessions]
    return {
        "schema": PAGES_SCHEMA,
        "devices": [_device(msg.device, sessions)],
        "pages": [{"page_id": p.page_id, "session_id": p.session_id, "state": names.get(p.state, "unknown"),
                   "use": _USES.get(p.use, "unknown")} for p in msg.pages],
        "sessions": sessions,
        "hidden_pages": msg.hidden_pages,
    }


def quota_doc(msg: Any) -> dict[str, Any]:
    return {"schema": QUOTA_SCHEMA, "quotas": [_quota(q) for q in msg.quotas],
            "default": {"min_bytes": msg.default_quota.min_bytes, "max_bytes": msg.default_quota.max_bytes}}


def proc_doc(record: dict[str, Any], *, alive: bool, now: float | None = None) -> dict[str, Any]:
    """``vtalloc stats --pid PID --json`` from a published record (allocator/publish.py)."""
    now = time.time() if now is None else now
    return {"schema": PROC_SCHEMA, "pid": record["pid"], "uid": record.get("uid"), "alive": alive,
            "age_s": max(0.0, now - float(record["updated_unix"])), "interval_s": record.get("interval_s"),
            "spaces": record["spaces"]}


# -- tables ------------------------------------------------------------------------------------
# Each table is built as columns and rows of plain text, then laid out at the terminal's width
# by layout.fit: columns that do not fit go to a further block of rows (the key columns
# repeated), so nothing is dropped at 80 columns. width=None: one block, as wide as it needs.
def _b(n: int | None) -> str:
    return "-" if n is None else format_size(int(n))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _grid(title: str, spec: list[tuple[str, bool]], rows: list[list[str]], width: int | None,
          short_title: str | None = None, *, record: bool = False, caption: str | None = None,
          empty: str = "(none)") -> list[Table]:
    return fit(title, [Column(h, key) for h, key in spec], rows, width, short_title=short_title, record=record,
               caption=caption, empty=empty)


# Under a table that shows "?" for what a session has not reported yet.
NOT_REPORTED = ("?: not reported yet. A client reports its own page counts (resident, cached, evicted, "
                "fragmentation) every report_interval_s (1 s by default); until its first report the daemon "
                "knows only what it leased")


def _not_reported_note(sessions: list[dict[str, Any]]) -> str | None:
    return NOT_REPORTED if any(not s["reported"] for s in sessions) else None


def stats_tables(doc: dict[str, Any], width: int | None = None) -> list[Table]:
    out = []
    rows = [[f"{d['backend']}:{d['device']}", f"{d['capacity_pages']} pg / {_b(d['capacity_bytes'])}",
             f"{d['leased_pages']} pg / {_b(d['leased_bytes'])}", f"{d['free_pages']} pg / {_b(d['free_bytes'])}",
             f"{d['inherited_pages']} pg / {d['inherited_processes']} proc",
             f"{d['evicted_pages']} pg / {_b(d['evicted_bytes'])}", str(d["delivering_pages"]),
             _pct(d["fragmentation"])] for d in doc["devices"]]
    out += _grid("vtalloc node", [("device", True), ("capacity", False), ("leased", False), ("free", False),
                                  ("inherited", False), ("evicted", False), ("delivering", False), ("frag", False)],
                 rows, width, record=len(rows) == 1)
    hidden = f" ({doc['hidden_sessions']} of other users hidden)" if doc["hidden_sessions"] else ""
    rows = []
    for x in doc["sessions"]:
        rep = x["reported"]
        rows.append([x["session_id"], str(x["pid"]), x["principal"], str(x["leased_pages"]),
                     str(x["resident_pages"]) if rep else "?", str(x["cached_pages"]) if rep else "?",
                     str(x["evicted_pages"]) if rep else "?", _b(x["paused_bytes"]) if rep else "?",
                     f"{_b(x['quota']['min_bytes'])}/{_b(x['quota']['max_bytes'])}",
                     _pct(x["fragmentation"]) if rep else "?", f"{x['evictions_per_s']:.1f}",
                     f"{x['restores_per_s']:.1f}", str(x["deadline_misses"])])
    out += _grid(f"sessions{hidden} (pages; paused bytes; quota min/max; evictions and restores per second)",
                 [("session", True), ("pid", False), ("principal", False), ("leased", False), ("resident", False),
                  ("cached", False), ("evicted", False), ("paused", False), ("quota", False), ("frag", False),
                  ("ev/s", False), ("rs/s", False), ("misses", False)], rows, width, "sessions",
                 caption=_not_reported_note(doc["sessions"]), empty="(no sessions)")
    out += _regions_table(doc["sessions"], width)
    c = doc["counters"]
    keys = ("leases_total", "pages_leased_total", "pages_returned_total", "quota_rejections_total",
            "evict_requests_total", "deadline_misses_total", "kills_total", "reclaims_total", "reclaimed_pages_total")
    out += _grid("since the daemon started", [(h, False) for h in (
        "leases", "pages leased", "returned", "quota refusals", "evict requests", "misses", "kills", "reclaims",
        "reclaimed pages")], [[str(c[k]) for k in keys]], width, record=True)
    return out


def _regions_table(sessions: list[dict[str, Any]], width: int | None) -> list[Table]:
    """Each session's regions, one row per tag (none when no session reported one)."""
    rows = [[x["session_id"], str(x["pid"]), r["tag"], _b(r["bytes"]), _b(r["paused_bytes"]), _b(r["host_bytes"])]
            for x in sessions if x["reported"] for r in x["regions"]]
    if not rows:
        return []
    return _grid("regions (docs/regions.md: paused bytes are off the device until resumed)",
                 [("session", True), ("pid", False), ("region", True), ("bytes", False), ("paused", False),
                  ("host", False)], rows, width, "regions")


def _ranges(ids: list[int]) -> str:
    """[1,2,3,7,9,10] -> '1-3,7,9-10'."""
    parts, start, prev = [], None, None
    for i in sorted(ids):
        if start is None:
            start = prev = i
        elif prev is not None and i == prev + 1:
            prev = i
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def pages_tables(doc: dict[str, Any], width: int | None = None) -> list[Table]:
    d = doc["devices"][0]
    rows = []
    for s in doc["sessions"]:
        mine = [p for p in doc["pages"] if p["session_id"] == s["session_id"]]
        rep = s["reported"]
        rows.append([s["session_id"], s["principal"], str(s["pid"]), str(len(mine)),
                     str(sum(p["state"] == "delivering" for p in mine)),
                     str(s["resident_pages"]) if rep else "?", str(s["cached_pages"]) if rep else "?",
                     str(s["unmapped_pages"]) if rep else "?", str(s["evicted_pages"]) if rep else "?",
                     _b(s["paused_bytes"]) if rep else "?", _ranges([p["page_id"] for p in mine]) or "-"])
    return _grid(f"page map: {d['capacity_pages']} pages of {_b(d['page_bytes'])}, {d['free_pages']} free"
                 + (f", {doc['hidden_pages']} of other users hidden" if doc["hidden_pages"] else ""),
                 [("session", True), ("principal", False), ("pid", False), ("pages", False), ("delivering", False),
                  ("resident", False), ("cached", False), ("unmapped", False), ("evicted", False),
                  ("paused", False), ("page ids", False)], rows, width, "page map",
                 caption=_not_reported_note(doc["sessions"]), empty="(no session holds a page)")


def quota_tables(doc: dict[str, Any], width: int | None = None) -> list[Table]:
    rows = [[q["principal"], _b(q["min_bytes"]), _b(q["max_bytes"])] for q in doc["quotas"]]
    rows.append(["(default)", _b(doc["default"]["min_bytes"]), _b(doc["default"]["max_bytes"])])
    return _grid("quotas", [("principal", True), ("min (guaranteed)", False), ("max (hard)", False)], rows, width)


def proc_tables(doc: dict[str, Any], width: int | None = None) -> list[Table]:
    state = "alive" if doc["alive"] else "exited"
    rows = []
    for sp in doc["spaces"]:
        st = sp["stats"]
        rows.append([sp["name"], f"{sp['backend']}:{sp['device']}" + (" (leased)" if sp.get("leased") else ""),
                     _b(st["capacity_bytes"]), _b(st["allocated_bytes"]), _b(st["active_bytes"]),
                     _b(st["mapped_bytes"]), _b(st["cached_bytes"]), f"{st['pages_mapped']}/{st['pages_total']}",
                     _pct(st["fragmentation"]), str(st["num_live_allocs"]), str(st["num_ooms"]), _driver_calls(st)])
    return _grid(f"pid {doc['pid']} ({state}, published {doc['age_s']:.1f} s ago)",
                 [("space", True), ("backend", False), ("capacity", False), ("allocated", False), ("active", False),
                  ("mapped", False), ("cached", False), ("pages", False), ("frag", False), ("allocs", False),
                  ("OOMs", False), ("driver calls", False)], rows, width, f"pid {doc['pid']}")


# (label, Stats field): the driver calls a page move pays for, as `vtalloc stats --pid` shows them.
_CALLS_SHOWN = (("map", "num_map_calls"), ("unmap", "num_unmap_calls"), ("access", "num_set_access_calls"),
                ("create", "num_create_page_calls"), ("release", "num_release_page_calls"),
                ("record", "num_event_record_calls"), ("query", "num_event_query_calls"))


def _driver_calls(st: dict[str, Any]) -> str:
    """'map 4 unmap 2 ...'; a field a record from an older vtalloc lacks shows as '-'."""
    return " ".join(f"{label} {st.get(field, '-')}" for label, field in _CALLS_SHOWN)
