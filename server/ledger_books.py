"""The ledger's books: the state every ledger part reads and writes, under one lock.

Owns: the ledger's shared state (sessions by id and by token, the owner of each leased page,
eviction tickets, the pages *inherited* from a previous daemon's clients, the pages processes
*retain*, the node's counters, the lock) and the rules that only count: pages held and free,
the retained and inherited holders, the counters. The other parts of :class:`~.ledger.Ledger`
(ledger_sessions, ledger_reports, ledger_quotas, ledger_leases, ledger_victims,
ledger_views) are each handed these books at construction; none inherits from another.
Invariants: no I/O, no gRPC, no asyncio; the state's fields are written only by the ledger's
parts, each under ``lock`` (an RLock: one part's rule may call another's); every public
method takes the lock; page ids are never reused (the page pool hands out fresh ones), so an
id seen once identifies a page for the daemon's lifetime.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

from .inherited import Inherited
from .records import EvictTicket, Holder, NodeCounters, NodeGeometry, Retained, Session

__all__ = ["LedgerBooks"]


class LedgerBooks:
    def __init__(self, geometry: NodeGeometry, clock: Callable[[], float]) -> None:
        self.geometry = geometry
        self.clock = clock
        self.started = clock()
        self.lock = threading.RLock()
        self.sessions: dict[str, Session] = {}
        self.by_token: dict[str, Session] = {}
        self.owner: dict[int, Session] = {}
        self.inherited = Inherited(geometry.page_bytes)
        self.tickets: dict[int, EvictTicket] = {}
        self.counters = NodeCounters()
        self.retained: dict[int, Retained] = {}   # pid -> pages it may still reach (page_reclaim.py)

    # -- counters ---------------------------------------------------------------------------
    def count_protocol_error(self) -> None:
        with self.lock:
            self.counters.protocol_errors_total += 1

    def count_kill(self) -> None:
        with self.lock:
            self.counters.kills_total += 1

    # -- pages held and free ----------------------------------------------------------------
    def free_pages(self) -> int:
        with self.lock:
            return max(0, self.geometry.capacity_pages - self.unavailable())

    def unavailable(self) -> int:
        """Pages not free: owned by sessions, inherited, or retained by processes that may reach them."""
        with self.lock:
            return len(self.owner) + self.inherited.pages + self.retained_count()

    def retained_count(self) -> int:
        with self.lock:
            return sum(len(r.pages) for r in self.retained.values())

    # -- retained: pages a process may still reach, no session of it holding them ------------
    def retain(self, s: Session, page_ids: Iterable[int]) -> None:
        """Count ``page_ids`` (no longer any session's) as reachable by ``s``'s process until it exits."""
        ids = set(page_ids)
        if not ids:
            return
        with self.lock:
            r = self.retained.get(s.pid)
            if r is None or r.start_ticks != s.start_ticks:
                # A new process under a pid whose old one's exit is not seen yet: the old pages
                # stay counted (the safe side) until this one exits too.
                old = r.pages if r is not None else set()
                r = self.retained[s.pid] = Retained(s.pid, s.start_ticks, s.uid, s.principal, old)
            r.pages |= ids

    def take_retained(self, s: Session, most: int) -> list[int]:
        """Up to ``most`` pages ``s``'s own process retains, no longer retained (to lease again)."""
        with self.lock:
            r = self.retained.get(s.pid)
            if r is None or r.start_ticks != s.start_ticks or most <= 0:
                return []
            ids = sorted(r.pages)[:most]
            r.pages.difference_update(ids)
            if not r.pages:
                del self.retained[s.pid]
            return ids

    def reusable(self, s: Session) -> int:
        """Pages ``s``'s process retains, which its next lease gets first."""
        with self.lock:
            r = self.retained.get(s.pid)
            return len(r.pages) if r is not None and r.start_ticks == s.start_ticks else 0

    def forget_retained(self, pid: int) -> list[int]:
        """Process ``pid`` exited: its retained pages, for the caller to release."""
        with self.lock:
            r = self.retained.pop(pid, None)
            return sorted(r.pages) if r else []

    # -- inherited: what a previous daemon's clients still hold (inherited.py) -------------
    def inherit(self, h: Holder) -> None:
        with self.lock:
            self.inherited.add(h)

    def forget_inherited(self, pid: int) -> int:
        """Process ``pid`` is gone: its inherited pages are free again; returns how many."""
        with self.lock:
            return self.inherited.forget(pid)

    def holders(self) -> list[Holder]:
        """What the state file records: client processes holding pages, inherited ones included."""
        with self.lock:
            return self.inherited.holders(self.sessions.values(), self.retained.values(),
                                          self.geometry.page_bytes)
