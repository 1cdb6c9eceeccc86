"""The ledger: sessions, the pages leased to them, quotas, and eviction requests.

Owns: the composition of the service's bookkeeping, one concept per module, each a class
over the one below (so each uses only the rules below it, and all share one lock):
ledger_books (the state, counters, pages held and free, inherited holders) <- ledger_sessions
(sessions, who sees whom, reports) <- ledger_quotas <- ledger_leases (admission, ownership,
pages given back) <- ledger_victims (whom to ask for pages, eviction tickets) <- ledger_views
(stats, page map, metrics) <- :class:`Ledger`, which adds the operator's quotas at start and
``check_invariants``. No I/O, no gRPC and no asyncio, so each rule is testable alone
(tests/test_service_ledger.py). The node (node.py) does the I/O around it: it asks the
ledger, creates or releases pages, and tells the ledger what happened. What it answers are
the frozen views of views.py.

Invariants (``check_invariants()``; each module's header says which rules hold each):
- every leased page id has exactly one owner, a live session, and is in that session's pages,
  or is retained by exactly one process that may still reach it (page_reclaim.py), never both;
- the pages held by all sessions never exceed the node's capacity, and a lease is admitted only
  while they fit beside the pages *inherited*: those that live processes of a previous daemon
  still hold (state_file.py), counted until each such process exits, and those retained;
- the quota minimums of all principals together fit in the node's capacity;
- a principal's pages never exceed its maximum because of a lease the ledger admitted.
Reports are untrusted: reports.py keeps their values in range and their sums in a uint64.
Thread safety: every public method takes one lock (the metrics thread reads while the event
loop writes).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from vtalloc.allocator.errors import InternalError

from .ledger_views import LedgerViews
from .quota import PrincipalMap, Quota
from .records import SESSION_KINDS, EvictTicket, NodeGeometry, Session
from .views import PAGE_STATES, PAGE_USES, ClientReport, PageUseReport

__all__ = [
    "Ledger", "NodeGeometry", "Session", "ClientReport", "PageUseReport", "EvictTicket", "PAGE_STATES", "PAGE_USES",
    "SESSION_KINDS",
]


class Ledger(LedgerViews):
    def __init__(self, geometry: NodeGeometry, *, default_quota: Quota | None = None,
                 quotas: Iterable[Quota] = (), principals: PrincipalMap = PrincipalMap(),
                 admin_uids: Iterable[int] = (0,), admin_cgroups: tuple[str, ...] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(geometry, default_quota=default_quota, principals=principals, admin_uids=admin_uids,
                         admin_cgroups=admin_cgroups, clock=clock)
        for q in quotas:
            self.set_quota(q.principal, q.min_bytes, q.max_bytes)

    def check_invariants(self) -> None:
        with self._lock:
            held = 0
            for s in self._sessions.values():
                for p in s.pages:
                    if self._owner.get(p) is not s:
                        raise InternalError(f"page {p} of session {s.session_id} has another owner")
                held += len(s.pages)
            if held != len(self._owner):
                raise InternalError(f"{len(self._owner)} owned pages but sessions hold {held}")
            if self._unavailable() > self.geometry.capacity_pages:
                raise InternalError("more pages held, inherited and retained than the node's capacity")
            if any(p in self._owner for r in self._retained.values() for p in r.pages):
                raise InternalError("a retained page is also a session's")
            page = self.geometry.page_bytes
            if sum(-(-q.min_bytes // page) for q in self._quotas.values()) > self.geometry.capacity_pages:
                raise InternalError("quota minimums exceed the node's capacity")
