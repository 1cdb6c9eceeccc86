"""The ledger's books: the state every ledger rule reads and writes, under one lock.

Owns: the ledger's shared state (sessions by id and by token, the owner of each leased page,
eviction tickets, the pages *inherited* from a previous daemon's clients, the node's counters)
and the rules that only count: pages held and free, the inherited holders, the counters.
Each concept's rules are a class above this one (ledger_sessions, ledger_quotas,
ledger_leases, ledger_victims, ledger_views), composed into :class:`~.ledger.Ledger`.
Invariants: no I/O, no gRPC, no asyncio; every public method takes the one lock (an RLock:
rules call each other); page ids are never reused (the page pool hands out fresh ones), so an
id seen once identifies a page for the daemon's lifetime.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Iterable

from .inherited import Inherited
from .quota import PrincipalMap, Quota
from .records import EvictTicket, Holder, NodeCounters, NodeGeometry, Retained, Session

__all__ = ["LedgerBooks"]


class LedgerBooks:
    def __init__(self, geometry: NodeGeometry, *, default_quota: Quota | None = None,
                 principals: PrincipalMap = PrincipalMap(),
                 admin_uids: Iterable[int] = (0,), admin_cgroups: tuple[str, ...] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.geometry = geometry
        self._clock = clock
        self._started = clock()
        self._lock = threading.RLock()
        cap = geometry.capacity_bytes
        self._default_quota = (default_quota or Quota("", 0, cap)).keepable(cap)
        self._quotas: dict[str, Quota] = {}
        self._principals = principals
        self._admin_uids = frozenset(admin_uids)
        self._admin_cgroups = admin_cgroups      # None: uid mode, admin by uid alone
        self._sessions: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        self._owner: dict[int, Session] = {}
        self._inherited = Inherited(geometry.page_bytes)
        self._tickets: dict[int, EvictTicket] = {}
        self._next_ticket = 1
        self._next_lease = 1
        self._counters = NodeCounters()
        self._quota_rejections: dict[str, int] = {}
        self._retained: dict[int, Retained] = {}   # pid -> pages it may still reach (page_reclaim.py)

    # -- counters ---------------------------------------------------------------------------
    def count_protocol_error(self) -> None:
        with self._lock:
            self._counters.protocol_errors_total += 1

    def count_kill(self) -> None:
        with self._lock:
            self._counters.kills_total += 1


    def counters(self) -> dict[str, int]:
        with self._lock:
            return dataclasses.asdict(self._counters)

    # -- pages held and free ----------------------------------------------------------------
    def held_pages(self) -> int:
        with self._lock:
            return len(self._owner)

    def free_pages(self) -> int:
        with self._lock:
            return max(0, self.geometry.capacity_pages - self._unavailable())

    def _unavailable(self) -> int:
        """Pages not free: owned by sessions, inherited, or retained by processes that may reach them."""
        return len(self._owner) + self._inherited.pages + self._retained_count()

    def _retained_count(self) -> int:
        return sum(len(r.pages) for r in self._retained.values())

    # -- retained: pages a process may still reach, no session of it holding them ------------
    def retain(self, s: Session, page_ids: Iterable[int]) -> None:
        """Count ``page_ids`` (no longer any session's) as reachable by ``s``'s process until it exits."""
        ids = set(page_ids)
        if not ids:
            return
        with self._lock:
            r = self._retained.get(s.pid)
            if r is None or r.start_ticks != s.start_ticks:
                # A new process under a pid whose old one's exit is not seen yet: the old pages
                # stay counted (the safe side) until this one exits too.
                old = r.pages if r is not None else set()
                r = self._retained[s.pid] = Retained(s.pid, s.start_ticks, s.uid, s.principal, old)
            r.pages |= ids

    def retained_by(self, pid: int) -> int:
        with self._lock:
            r = self._retained.get(pid)
            return len(r.pages) if r else 0

    def take_retained(self, s: Session, most: int) -> list[int]:
        """Up to ``most`` pages ``s``'s own process retains, no longer retained (to lease again)."""
        with self._lock:
            r = self._retained.get(s.pid)
            if r is None or r.start_ticks != s.start_ticks or most <= 0:
                return []
            ids = sorted(r.pages)[:most]
            r.pages.difference_update(ids)
            if not r.pages:
                del self._retained[s.pid]
            return ids

    def reusable(self, s: Session) -> int:
        """Pages ``s``'s process retains, which its next lease gets first."""
        with self._lock:
            r = self._retained.get(s.pid)
            return len(r.pages) if r is not None and r.start_ticks == s.start_ticks else 0

    def forget_retained(self, pid: int) -> list[int]:
        """Process ``pid`` exited: its retained pages, for the caller to release."""
        with self._lock:
            r = self._retained.pop(pid, None)
            return sorted(r.pages) if r else []


    # -- inherited: what a previous daemon's clients still hold (inherited.py) -------------
    def inherit(self, h: Holder) -> None:
        with self._lock:
            self._inherited.add(h)

    def forget_inherited(self, pid: int) -> int:
        """Process ``pid`` is gone: its inherited pages are free again; returns how many."""
        with self._lock:
            return self._inherited.forget(pid)

    def holders(self) -> list[Holder]:
        """What the state file records: client processes holding pages, inherited ones included."""
        with self._lock:
            return self._inherited.holders(self._sessions.values(), self._retained.values(),
                                           self.geometry.page_bytes)
