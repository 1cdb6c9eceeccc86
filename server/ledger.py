"""The ledger: sessions, the pages leased to them, quotas, and eviction requests.

Owns: building the service's bookkeeping from its parts, one concept per class, and holding
them (composition: each part is handed the parts it reads at construction; none inherits
from another): ``books`` (ledger_books: the state, counters, pages held and free, retained
and inherited holders), ``sessions`` (ledger_sessions: sessions, who sees whom), ``reports``
(ledger_reports), ``quotas`` (ledger_quotas), ``leases`` (ledger_leases: admission, ownership,
pages given back), ``victims`` (ledger_victims: whom to ask for pages, eviction tickets) and
``views`` (ledger_views: stats, page map, metrics). Callers use the parts
(``ledger.quotas.set(...)``, ``ledger.leases.admit(...)``); :class:`Ledger` adds only the
operator's quotas at start. No I/O, no gRPC and no asyncio, so each rule is testable alone
(tests/test_service_ledger.py; tests/helpers/ledger_checks.py checks the invariants below).
The node (node.py) does the I/O around it: it asks the ledger, creates or releases pages, and
tells the ledger what happened. What it answers are the frozen views of views.py.

Invariants (each part's header says which rules hold each):
- every leased page id has exactly one owner, a live session, and is in that session's pages,
  or is retained by exactly one process that may still reach it (page_reclaim.py), never both;
- the pages held by all sessions never exceed the node's capacity, and a lease is admitted only
  while they fit beside the pages *inherited*: those that live processes of a previous daemon
  still hold (state_file.py), counted until each such process exits, and those retained;
- the quota minimums of all principals together fit in the node's capacity;
- a principal's pages never exceed its maximum because of a lease the ledger admitted.
Reports are untrusted: reports.py keeps their values in range and their sums in a uint64.
Thread safety: every part's public method takes the books' one lock (the metrics thread reads
while the event loop writes).
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from .ledger_books import LedgerBooks
from .ledger_leases import LedgerLeases
from .ledger_quotas import LedgerQuotas
from .ledger_reports import LedgerReports
from .ledger_sessions import LedgerSessions
from .ledger_victims import LedgerVictims
from .ledger_views import LedgerViews
from .quota import PrincipalMap, Quota
from .records import SESSION_KINDS, EvictTicket, NodeGeometry, Session
from .views import PAGE_STATES, PAGE_USES, ClientReport, PageUseReport

__all__ = [
    "Ledger", "NodeGeometry", "Session", "ClientReport", "PageUseReport", "EvictTicket", "PAGE_STATES", "PAGE_USES",
    "SESSION_KINDS",
]


class Ledger:
    def __init__(self, geometry: NodeGeometry, *, default_quota: Quota | None = None,
                 quotas: Iterable[Quota] = (), principals: PrincipalMap = PrincipalMap(),
                 admin_uids: Iterable[int] = (0,), admin_cgroups: tuple[str, ...] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.geometry = geometry
        self.books = LedgerBooks(geometry, clock)
        self.sessions = LedgerSessions(self.books, principals=principals, admin_uids=admin_uids,
                                       admin_cgroups=admin_cgroups)
        self.reports = LedgerReports(self.books)
        self.quotas = LedgerQuotas(self.books, default_quota)
        self.leases = LedgerLeases(self.books, self.quotas)
        self.victims = LedgerVictims(self.books, self.quotas)
        self.views = LedgerViews(self.books, self.sessions, self.quotas)
        for q in quotas:
            self.quotas.set(q.principal, q.min_bytes, q.max_bytes)
