"""The ledger's views: what a caller may see of the node, as frozen views (views.py).

Owns: stats, the page map and the metrics' snapshot as a caller may see them (None: all, for
metrics), built from the books by snapshot.py under the books' lock. Holds the books
(ledger_books.py), the sessions (ledger_sessions.py: who sees whom) and the quotas
(ledger_quotas.py: the quota in force, the refusals by principal).
Invariants: a view is a snapshot taken under one lock (nothing in it refers back to the live
books); a non-admin caller sees only its own uid's and principal's sessions and principal,
and learns only how many others are hidden.
"""

from __future__ import annotations

import dataclasses

from .ledger_books import LedgerBooks
from .ledger_quotas import LedgerQuotas
from .ledger_sessions import LedgerSessions
from .protocol.errors import NotFoundError, echo
from .records import Session
from .snapshot import device_view, page_views, pages_by_state, principal_view, session_view
from .views import DeviceView, NodeView, PageMapView, SessionInfoView

__all__ = ["LedgerViews"]


class LedgerViews:
    def __init__(self, books: LedgerBooks, sessions: LedgerSessions, quotas: LedgerQuotas) -> None:
        self._books = books
        self._sessions = sessions
        self._quotas = quotas

    def _info(self, s: Session) -> SessionInfoView:
        g = self._books.geometry
        return SessionInfoView(s.session_id, s.pid, s.uid, s.principal, s.kind, g.backend, g.device, g.page_bytes,
                               g.capacity_bytes, g.host_capacity_bytes, self._quotas.for_session(s), len(s.pages),
                               g.evict_deadline_s, self._sessions.is_admin(s))

    def session_info(self, s: Session) -> SessionInfoView:
        with self._books.lock:
            return self._info(s)

    def _device(self) -> DeviceView:
        # Retained pages are held by clients (page_reclaim.py): leased, as the node sees it.
        b = self._books
        return device_view(b.geometry, b.sessions.values(), len(b.owner) + b.retained_count(),
                           b.inherited.pages, b.inherited.processes)

    def _visible(self, caller: Session | None, session_id: str) -> tuple[list[Session], int, bool]:
        admin = caller is None or self._sessions.is_admin(caller)
        clients = [s for s in self._books.sessions.values() if s.kind == "client"]
        if session_id:
            target = self._sessions.find(caller, session_id) if caller else self._books.sessions.get(session_id)
            if target is None:
                raise NotFoundError(f"no session {echo(session_id)}")
            return [target], 0, admin
        seen = [s for s in clients if admin or (caller is not None and self._sessions.sees(caller, s))]
        return seen, len(clients) - len(seen), admin

    def node_view(self, caller: Session | None, session_id: str = "") -> NodeView:
        """Stats as ``caller`` may see them (None: everything, for metrics)."""
        b = self._books
        with b.lock:
            now = b.clock()
            seen, hidden, admin = self._visible(caller, session_id)
            sessions = tuple(session_view(self._info(s), s, now) for s in sorted(seen, key=lambda x: x.started))
            rejections = self._quotas.rejections()
            principals = {q.principal for q in self._quotas.all()}
            principals |= {s.principal for s in b.sessions.values() if s.kind == "client"} | set(rejections)
            if not admin and caller is not None:  # not admin: there is a caller
                principals = {caller.principal}
            pviews = [principal_view(self._quotas.of(p), [s for s in b.sessions.values()
                                                          if s.kind == "client" and s.principal == p],
                                     rejections.get(p, 0)) for p in sorted(principals)]
            observers = sum(1 for s in b.sessions.values() if s.kind == "observer")
            return NodeView(now - b.started, self._device(), sessions, tuple(pviews),
                            dataclasses.asdict(b.counters), admin, hidden, observers)

    def page_map(self, caller: Session | None, session_id: str = "") -> PageMapView:
        with self._books.lock:
            seen, _, _ = self._visible(caller, session_id)
            pages, sessions = page_views(seen)
            return PageMapView(self._device(), pages, sessions, len(self._books.owner) - len(pages))

    def metrics_snapshot(self) -> tuple[NodeView, dict[str, int]]:
        """Everything metrics need, from one consistent moment: the full view and pages by state."""
        b = self._books
        with b.lock:
            by_state = pages_by_state(b.sessions.values(), b.free_pages(), b.inherited.pages)
            by_state["leased"] += b.retained_count()
            return self.node_view(None), by_state
