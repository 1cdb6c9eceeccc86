"""The ledger's victims: whom the node asks for pages when it runs short, and the requests.

Owns: the daemon's pressure targets (``pick``: principals above their guaranteed
minimum, most excess first) and the eviction tickets that record what was asked of whom.
Holds the books (ledger_books.py, where the tickets are) and the quotas (ledger_quotas.py,
what each principal holds above its minimum).
Each choice of what gives up memory has its own word (docs/design.md, "Glossary"): the core's
VictimPolicy (csrc/evict/), a client's give-back order (client/pressure.py), the paged
activations' evict-behind and make room (allocator/torch/), and these, across sessions.
Invariants: pages already asked for are not asked again; the requester is never asked; a
principal is never asked below its minimum; a ticket is judged at most once, and a miss is
counted once (session and node); every public method takes the books' lock.
"""

from __future__ import annotations

from .ledger_books import LedgerBooks
from .ledger_quotas import LedgerQuotas
from .records import EvictTicket, Session

__all__ = ["LedgerVictims"]


class LedgerVictims:
    def __init__(self, books: LedgerBooks, quotas: LedgerQuotas) -> None:
        self._books = books
        self._quotas = quotas
        self._next_ticket = 1

    def pick(self, need: int, requester: Session | None) -> list[tuple[Session, int]]:
        """Whom to ask for ``need`` pages: principals above their minimum, most excess first.

        Pages already asked for are not asked again; the requester itself is never asked.
        The result may cover less than ``need`` (then the node cannot free enough).
        """
        with self._books.lock:
            by_principal: dict[str, list[Session]] = {}
            for s in self._books.sessions.values():
                if s.kind == "client" and s is not requester and s.pages:
                    by_principal.setdefault(s.principal, []).append(s)
            order = []
            for principal, sessions in by_principal.items():
                pending = sum(x.outstanding_evict for x in sessions)
                spare = self._quotas.excess_pages(principal) - pending
                if spare > 0:
                    order.append((spare, principal, sessions))
            order.sort(key=lambda t: (-t[0], t[1]))
            picked: list[tuple[Session, int]] = []
            for spare, _, sessions in order:
                # A scope above the minimum it declared is asked first (ledger_quotas.py,
                # Note [Declared quotas bind their own uid]); then the sessions holding most.
                for s in sorted(sessions, key=lambda x: (-self._quotas.scope_excess_pages(x),
                                                         -(len(x.pages) - x.outstanding_evict), x.session_id)):
                    if need <= 0 or spare <= 0:
                        break
                    k = min(need, spare, len(s.pages) - s.outstanding_evict)
                    if k > 0:
                        picked.append((s, k))
                        need -= k
                        spare -= k
            return picked

    def open_eviction(self, s: Session, pages: int) -> EvictTicket:
        with self._books.lock:
            t = EvictTicket(self._next_ticket, s.session_id, pages)
            self._next_ticket += 1
            self._books.tickets[t.request_id] = t
            s.outstanding_evict += pages
            s.counters.evict_requests += 1
            s.counters.evict_pages_asked += pages
            self._books.counters.evict_requests_total += 1
            self._books.counters.evict_pages_asked_total += pages
            return t

    def close_eviction(self, t: EvictTicket, *, judge: bool) -> bool:
        """Close a request; with ``judge`` (its deadline passed and the pages are still needed),
        True if the session missed it (returned too little), counted as a deadline miss."""
        with self._books.lock:
            self._books.tickets.pop(t.request_id, None)
            s = self._books.sessions.get(t.session_id)
            missed = judge and t.returned < t.asked and s is not None and t.open
            t.open = False
            if s is not None:
                s.outstanding_evict = max(0, s.outstanding_evict - (t.asked - t.returned))
                if missed:
                    s.counters.deadline_misses += 1
            if missed:
                self._books.counters.deadline_misses_total += 1
            return missed
