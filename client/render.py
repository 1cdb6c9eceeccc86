"""What the service commands print: versioned JSON documents and the rich tables made from them.

Owns: the ``--json`` schemas (each document has ``"schema": "vtalloc.<name>/v<N>"``; a field is
never renamed or given a new meaning within a version, only added) and the tables. Pure
functions: messages or records in, dicts or tables out; no I/O, no RPC. Tables are built
from the JSON documents, so both always say the same thing. Units: bytes, seconds, pages.
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.table import Table

from vtalloc.allocator.config import format_size

__all__ = [
    "STATS_SCHEMA", "PROC_SCHEMA", "PAGES_SCHEMA", "QUOTA_SCHEMA", "HEALTH_SCHEMA", "EVICT_SCHEMA",
    "stats_doc", "pages_doc", "quota_doc", "proc_doc", "stats_tables", "pages_tables", "quota_table",
    "proc_table", "fragmentation",
]

STATS_SCHEMA = "vtalloc.stats/v1"
PROC_SCHEMA = "vtalloc.proc-stats/v1"
PAGES_SCHEMA = "vtalloc.pages/v1"
QUOTA_SCHEMA = "vtalloc.quota/v1"
HEALTH_SCHEMA = "vtalloc.health/v1"
EVICT_SCHEMA = "vtalloc.evict/v1"


def fragmentation(active_bytes: int, mapped_bytes: int) -> float:
    """1 - active / mapped: the share of mapped memory under no live allocation (0 when nothing is mapped)."""
    return 0.0 if mapped_bytes <= 0 else 1.0 - min(active_bytes, mapped_bytes) / mapped_bytes


def _quota(q: Any) -> dict[str, Any]:
    return {"principal": q.principal, "min_bytes": q.min_bytes, "max_bytes": q.max_bytes}


def _device(d: Any, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    page = d.page_bytes
    active = sum(s["active_bytes"] for s in sessions if s["reported"])
    mapped = sum(s["mapped_bytes"] for s in sessions if s["reported"])
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
        "host_capacity_bytes": d.host_capacity_bytes,
        "fragmentation": fragmentation(active, mapped),
    }


def _report(r: Any, page: int) -> dict[str, Any]:
    return {
        "allocated_bytes": r.allocated_bytes, "active_bytes": r.active_bytes, "mapped_bytes": r.mapped_bytes,
        "cached_bytes": r.cached_bytes, "resident_pages": r.pages_resident, "resident_bytes": r.pages_resident * page,
        "cached_pages": r.pages_cached,
        "unmapped_pages": r.pages_free, "evicted_pages": r.evicted_pages, "evicted_bytes": r.evicted_bytes,
        "evictions_total": r.evictions_total, "restores_total": r.restores_total, "ooms_total": r.ooms_total,
        "fragmentation": fragmentation(r.active_bytes, r.mapped_bytes),
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
def _table(title: str, *columns: str, wide: tuple[str, ...] = ()) -> Table:
    """A compact table; ``wide`` columns (ids, names) are never truncated."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in columns:
        t.add_column(c, no_wrap=c in wide, min_width=len(c))
    return t


def _b(n: int | None) -> str:
    return "-" if n is None else format_size(int(n))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def stats_tables(doc: dict[str, Any]) -> list[Table]:
    out = []
    t = _table("vtalloc node", "device", "capacity", "leased", "free", "inherited", "evicted", "delivering", "frag",
               wide=("device",))
    for d in doc["devices"]:
        t.add_row(f"{d['backend']}:{d['device']}", f"{d['capacity_pages']} pg / {_b(d['capacity_bytes'])}",
                  f"{d['leased_pages']} pg / {_b(d['leased_bytes'])}", f"{d['free_pages']} pg / {_b(d['free_bytes'])}",
                  f"{d['inherited_pages']} pg / {d['inherited_processes']} proc",
                  f"{d['evicted_pages']} pg / {_b(d['evicted_bytes'])}", str(d["delivering_pages"]),
                  _pct(d["fragmentation"]))
    out.append(t)
    hidden = f" ({doc['hidden_sessions']} of other users hidden)" if doc["hidden_sessions"] else ""
    s = _table(f"sessions{hidden} (pages; quota min/max; evictions and restores per second)", "session", "pid",
               "principal", "leased", "resident", "cached", "evicted", "quota", "frag", "ev/s", "rs/s", "misses",
               wide=("session", "pid", "principal", "quota"))
    for x in doc["sessions"]:
        rep = x["reported"]
        s.add_row(x["session_id"], str(x["pid"]), x["principal"], str(x["leased_pages"]),
                  str(x["resident_pages"]) if rep else "?", str(x["cached_pages"]) if rep else "?",
                  str(x["evicted_pages"]) if rep else "?",
                  f"{_b(x['quota']['min_bytes'])}/{_b(x['quota']['max_bytes'])}",
                  _pct(x["fragmentation"]) if rep else "?", f"{x['evictions_per_s']:.1f}",
                  f"{x['restores_per_s']:.1f}", str(x["deadline_misses"]))
    out.append(s)
    c = doc["counters"]
    k = _table("since the daemon started", "leases", "pages leased", "returned", "quota refusals",
               "evict requests", "misses", "kills", "reclaims", "reclaimed pages")
    k.add_row(*(str(c[key]) for key in ("leases_total", "pages_leased_total", "pages_returned_total",
                                        "quota_rejections_total", "evict_requests_total", "deadline_misses_total",
                                        "kills_total", "reclaims_total", "reclaimed_pages_total")))
    out.append(k)
    return out


def _ranges(ids: list[int]) -> str:
    """[1,2,3,7,9,10] -> '1-3,7,9-10'."""
    parts, start, prev = [], None, None
    for i in sorted(ids):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = i
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def pages_tables(doc: dict[str, Any]) -> list[Table]:
    d = doc["devices"][0]
    t = _table(f"page map: {d['capacity_pages']} pages of {_b(d['page_bytes'])}, {d['free_pages']} free"
               + (f", {doc['hidden_pages']} of other users hidden" if doc["hidden_pages"] else ""),
               "session", "principal", "pid", "pages", "delivering", "resident", "cached", "unmapped", "evicted",
               "page ids", wide=("session", "principal"))
    for s in doc["sessions"]:
        mine = [p for p in doc["pages"] if p["session_id"] == s["session_id"]]
        rep = s["reported"]
        t.add_row(s["session_id"], s["principal"], str(s["pid"]), str(len(mine)),
                  str(sum(p["state"] == "delivering" for p in mine)),
                  str(s["resident_pages"]) if rep else "?", str(s["cached_pages"]) if rep else "?",
                  str(s["unmapped_pages"]) if rep else "?", str(s["evicted_pages"]) if rep else "?",
                  _ranges([p["page_id"] for p in mine]) or "-")
    return [t]


def quota_table(doc: dict[str, Any]) -> Table:
    t = _table("quotas", "principal", "min (guaranteed)", "max (hard)", wide=("principal",))
    for q in doc["quotas"]:
        t.add_row(q["principal"], _b(q["min_bytes"]), _b(q["max_bytes"]))
    t.add_row("(default)", _b(doc["default"]["min_bytes"]), _b(doc["default"]["max_bytes"]))
    return t


def proc_table(doc: dict[str, Any]) -> Table:
    state = "alive" if doc["alive"] else "exited"
    t = _table(f"pid {doc['pid']} ({state}, published {doc['age_s']:.1f} s ago)", "space", "backend", "capacity",
               "allocated", "active", "mapped", "cached", "pages", "frag", "allocs", "OOMs", "driver calls",
               wide=("space",))
    for sp in doc["spaces"]:
        st = sp["stats"]
        t.add_row(sp["name"], f"{sp['backend']}:{sp['device']}" + (" (leased)" if sp.get("leased") else ""),
                  _b(st["capacity_bytes"]), _b(st["allocated_bytes"]), _b(st["active_bytes"]), _b(st["mapped_bytes"]),
                  _b(st["cached_bytes"]), f"{st['pages_mapped']}/{st['pages_total']}", _pct(st["fragmentation"]),
                  str(st["num_live_allocs"]), str(st["num_ooms"]), _driver_calls(st))
    return t


# (label, Stats field): the driver calls a page move pays for, as `vtalloc stats --pid` shows them.
_CALLS_SHOWN = (("map", "num_map_calls"), ("unmap", "num_unmap_calls"), ("access", "num_set_access_calls"),
                ("create", "num_create_page_calls"), ("release", "num_release_page_calls"),
                ("record", "num_event_record_calls"), ("query", "num_event_query_calls"))


def _driver_calls(st: dict[str, Any]) -> str:
    """'map 4 unmap 2 ...'; a field a record from an older vtalloc lacks shows as '-'."""
    return " ".join(f"{label} {st.get(field, '-')}" for label, field in _CALLS_SHOWN)
