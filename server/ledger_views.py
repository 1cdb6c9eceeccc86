"""The ledger's views: what a caller may see of the node, as frozen views (views.py).

Owns: stats, the page map and the metrics' snapshot as a caller may see them (None: all, for
metrics), built from the books by snapshot.py under the ledger's lock.
Invariants: a view is a snapshot taken under one lock (nothing in it refers back to the live
books); a non-admin caller sees only its own uid's and principal's sessions and principal,
and learns only how many others are hidden.
"""

from __future__ import annotations

import dataclasses

from .ledger_victims import LedgerVictims
from .protocol.errors import NotFoundError, echo
from .records import Session
from .snapshot import device_view, page_views, pages_by_state, principal_view, session_view
from .views import DeviceView, NodeView, PageMapView, SessionInfoView

__all__ = ["LedgerViews"]


class LedgerViews(LedgerVictims):
    def _info(self, s: Session) -> SessionInfoView:
        g = self.geometry
        return SessionInfoView(s.session_id, s.pid, s.uid, s.principal, s.kind, g.backend, g.device, g.page_bytes,
                               g.capacity_bytes, g.host_capacity_bytes, self.quota_for(s), len(s.pages),
                               g.evict_deadline_s, self.is_admin(s))

    def session_info(self, s: Session) -> SessionInfoView:
        with self._lock:
            return self._info(s)

    def _device(self) -> DeviceView:
        # Retained pages are held by clients (page_reclaim.py): leased, as the node sees it.
        return device_view(self.geometry, self._sessions.values(), len(self._owner) + self._retained_count(),
                           self._inherited.pages,
                           self._inherited.processes)

    def _visible(self, caller: Session | None, session_id: str) -> tuple[list[Session], int, bool]:
        admin = caller is None or self.is_admin(caller)
        clients = [s for s in self._sessions.values() if s.kind == "client"]
        if session_id:
            target = self.session_for(caller, session_id) if caller else self._sessions.get(session_id)
            if target is None:
                raise NotFoundError(f"no session {echo(session_id)}")
            return [target], 0, admin
        seen = [s for s in clients if admin or (caller is not None and self._sees(caller, s))]
        return seen, len(clients) - len(seen), admin

    def node_view(self, caller: Session | None, session_id: str = "") -> NodeView:
        """Stats as ``caller`` may see them (None: everything, for metrics)."""
        with self._lock:
            now = self._clock()
            seen, hidden, admin = self._visible(caller, session_id)
            sessions = tuple(session_view(self._info(s), s, now) for s in sorted(seen, key=lambda x: x.started))
            principals = set(self._quotas) | {s.principal for s in self._sessions.values() if s.kind == "client"}
            principals |= set(self._quota_rejections)
            if not admin and caller is not None:  # not admin: there is a caller
                principals = {caller.principal}
            pviews = [principal_view(self.quota_of(p), [s for s in self._sessions.values()
                                                        if s.kind == "client" and s.principal == p],
                                     self._quota_rejections.get(p, 0)) for p in sorted(principals)]
            observers = sum(1 for s in self._sessions.values() if s.kind == "observer")
            return NodeView(now - self._started, self._device(), sessions, tuple(pviews),
                            dataclasses.asdict(self._counters), admin, hidden, observers)

    def page_map(self, caller: Session | None, session_id: str = "") -> PageMapView:
        with self._lock:
            seen, _, _ = self._visible(caller, session_id)
            pages, sessions = page_views(seen)
            return PageMapView(self._device(), pages, sessions, len(self._owner) - len(pages))

    def metrics_snapshot(self) -> tuple[NodeView, dict[str, int]]:
        """Everything metrics need, from one consistent moment: the full view and pages by state."""
        with self._lock:
            by_state = pages_by_state(self._sessions.values(), self.free_pages(), self._inherited.pages)
            by_state["leased"] += self._retained_count()
            return self.node_view(None), by_state
