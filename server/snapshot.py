"""Building the ledger's answers: frozen views (views.py) from its records (records.py).

Owns: how a view is computed from the records the ledger passes in (counts by state, sums of
client reports kept in a uint64). Invariants: pure functions, called by the ledger under
its lock; they read the records they are given and change nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from .records import NodeGeometry, Session
from .reports import saturating_sum
from .quota import Quota
from .views import (
    PAGE_STATES,
    ClientReport,
    DeviceView,
    PageView,
    PrincipalView,
    SessionInfoView,
    SessionPagesView,
    SessionView,
)

__all__ = ["device_view", "session_view", "principal_view", "page_views", "pages_by_state"]


def device_view(g: NodeGeometry, sessions: Iterable[Session], owned: int, inherited_pages: int,
                inherited_processes: int) -> DeviceView:
    sessions = list(sessions)
    delivering = sum(1 for s in sessions for st in s.pages.values() if st == "delivering")
    evicted_pages = saturating_sum(s.report.evicted_pages for s in sessions if s.report)
    evicted_bytes = saturating_sum(s.report.evicted_bytes for s in sessions if s.report)
    paused_bytes = saturating_sum(s.report.paused_bytes for s in sessions if s.report)
    free = max(0, g.capacity_pages - owned - inherited_pages)
    return DeviceView(g.backend, g.device, g.page_bytes, g.capacity_pages, owned - delivering, delivering, free,
                      evicted_pages, evicted_bytes, g.host_capacity_bytes, inherited_pages, inherited_processes,
                      paused_bytes)


def _report(s: Session) -> ClientReport:
    """The session's last report with its page uses decoded now (a view refers to nothing live)."""
    if s.report is None:
        return ClientReport()
    return dataclasses.replace(s.report, page_uses=tuple(s.page_uses))


def session_view(info: SessionInfoView, s: Session, now: float) -> SessionView:
    return SessionView(info, now - s.started, sum(1 for v in s.pages.values() if v == "delivering"),
                       s.report is not None, (now - s.report_at) if s.report else 0.0, _report(s),
                       s.evictions_per_s, s.restores_per_s, **dataclasses.asdict(s.counters))


def principal_view(quota: Quota, members: list[Session], quota_rejections: int) -> PrincipalView:
    return PrincipalView(quota, len(members), sum(len(s.pages) for s in members),
                         saturating_sum(s.report.evicted_bytes for s in members if s.report), quota_rejections)


def page_views(seen: list[Session]) -> tuple[tuple[PageView, ...], tuple[SessionPagesView, ...]]:
    pages = []
    for s in seen:
        uses = {u.page_id: u.use for u in _report(s).page_uses}
        pages += [PageView(p, s.session_id, st, uses.get(p, "unknown")) for p, st in sorted(s.pages.items())]
    sessions = tuple(SessionPagesView(s.session_id, s.principal, s.pid, s.report is not None, _report(s))
                     for s in sorted(seen, key=lambda x: x.started))
    return tuple(pages), sessions


def pages_by_state(sessions: Iterable[Session], free: int, inherited: int) -> dict[str, int]:
    """Pages by PAGE_STATES value, plus free and inherited (held by a previous daemon's clients)."""
    by_state = dict.fromkeys(PAGE_STATES, 0)
    for s in sessions:
        for state in s.pages.values():
            by_state[state] += 1
    by_state["free"] = free
    by_state["inherited"] = inherited
    return by_state
