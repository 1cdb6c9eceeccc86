"""The ledger's leases: admitting a lease, the pages on their way to a session, and the
pages a session gives back.

Owns: the owner of every leased page from the moment the node creates it (``delivering``)
through its delivery (``leased``) until the session gives it back or ends; lease ids. Holds
the books (ledger_books.py) and the quotas (ledger_quotas.py) a lease is admitted under.
Invariants: every public method takes the books' lock; every leased page id has exactly one
owner, a live session, and is in that session's pages (or is retained by its process:
ledger_books.py, page_reclaim.py); the pages held by all sessions never exceed the node's
capacity, and a lease is admitted only while they fit beside the pages inherited and
retained, a process's own retained pages counted as its lease's first; a principal's pages
never exceed its maximum because of a lease the ledger admitted (lowering a maximum later
refuses new leases; it takes nothing away); pages given back are checked all or none (each
owned by the session, none twice, none still being delivered) and any of them given back
while the session is asked to evict counts toward its eviction requests.
"""

from __future__ import annotations

import logging
from typing import Iterable

from vtalloc.allocator.errors import InternalError, InvalidArgumentError

from .ledger_books import LedgerBooks
from .ledger_quotas import LedgerQuotas
from .reports import check_uses_count
from .protocol.errors import FailedPreconditionError, NotFoundError, PermissionDeniedError, QuotaExceededError
from .records import Session

__all__ = ["LedgerLeases"]

log = logging.getLogger("vtalloc.server")


class LedgerLeases:
    def __init__(self, books: LedgerBooks, quotas: LedgerQuotas) -> None:
        self._books = books
        self._quotas = quotas
        self._next_lease = 1

    def admit(self, s: Session, pages: int) -> int:
        """Check a lease of ``pages``; returns how many pages the node is short (0: go ahead).

        Raises at once for a bad count, an observer session, or a lease past the maximum.
        """
        g = self._books.geometry
        if not 1 <= pages <= g.max_lease_pages:
            raise InvalidArgumentError(f"a lease asks for 1 to {g.max_lease_pages} pages, not {pages}")
        with self._books.lock:
            if s.kind != "client":
                raise FailedPreconditionError("an observer session cannot lease pages")
            new = max(0, pages - self._books.reusable(s))   # its process's retained pages come first, counted already
            over = self._quotas.over_maximum(s, new)
            if over is not None:
                q, used = over
                whose = s.principal if q == self._quotas.operator(s.principal) else \
                    f"{s.principal} (uid {s.uid}'s sessions, by their declared quota)"
                self._quotas.count_rejection(s)
                log.info("lease of %d pages for session %s (%s, pid %d) refused: %s holds %d pages, its "
                         "maximum is %d bytes", pages, s.session_id, s.principal, s.pid, whose, used, q.max_bytes)
                raise QuotaExceededError(
                    f"{whose} holds {used} pages of {g.page_bytes} bytes; {pages} more would pass its "
                    f"maximum of {q.max_bytes} bytes", requested_bytes=pages * g.page_bytes,
                    capacity_bytes=q.max_bytes, mapped_bytes=used * g.page_bytes)
            return max(0, new - (g.capacity_pages - self._books.unavailable()))


    def count_node_short(self) -> None:
        with self._books.lock:
            self._books.counters.node_short_rejections_total += 1

    def new_id(self) -> int:
        with self._books.lock:
            n = self._next_lease
            self._next_lease += 1
            return n

    def add_pages(self, s: Session, page_ids: list[int]) -> None:
        """Record fresh pages (or pages its process had retained, given to it again: take_retained)
        as on their way to ``s``."""
        b = self._books
        with b.lock:
            if not s.live:
                raise NotFoundError(f"session {s.session_id} has ended")
            if b.unavailable() + len(page_ids) > b.geometry.capacity_pages:
                raise InternalError("the ledger would hold more pages than the node's capacity")
            if twice := [p for p in page_ids if p in self._books.owner]:  # checked first: a refusal records none
                raise InternalError(f"page {twice[0]} handed out twice")
            for p in page_ids:
                self._books.owner[p] = s
                s.pages[p] = "delivering"

    def mark_delivered(self, s: Session, page_ids: list[int]) -> None:
        with self._books.lock:
            for p in page_ids:
                if s.pages.get(p) == "delivering":
                    s.pages[p] = "leased"
            s.counters.leases += 1
            s.counters.pages_leased += len(page_ids)
            self._books.counters.leases_total += 1
            self._books.counters.pages_leased_total += len(page_ids)

    def drop_pages(self, s: Session, page_ids: list[int]) -> None:
        """Forget pages whose delivery failed (the caller releases them)."""
        with self._books.lock:
            for p in page_ids:
                if self._books.owner.get(p) is s:
                    del self._books.owner[p]
                    s.pages.pop(p, None)

    def admit_return(self, s: Session, count: int, what: str = "return") -> None:
        """Refuse, before any work, a request naming more page ids than ``s`` holds pages (or
        than max_return_pages; reports.check_uses_count): each id must be a page of the
        session's, named once."""
        with self._books.lock:
            held = len(s.pages)
        check_uses_count(count, held, self._books.geometry.max_return_pages, what=f"{what} carries {count} page ids")

    def _owned(self, s: Session, page_ids: Iterable[int], what: str) -> list[int]:
        ids = list(page_ids)
        self.admit_return(s, len(ids), what)
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"{what} names a page more than once")
        for p in ids:
            owner = self._books.owner.get(p)
            if owner is None:
                raise NotFoundError(f"{what}: no leased page {p}")
            if owner is not s:
                raise PermissionDeniedError(f"{what}: page {p} belongs to another session")
        return ids


    def give_back(self, s: Session, page_ids: Iterable[int], evict_request_id: int = 0) -> list[int]:
        """Validate and remove the pages ``s`` gives back (all or none); returns them for the caller
        to release to the page pool."""
        with self._books.lock:
            if not s.live:
                raise NotFoundError(f"session {s.session_id} has ended")
            ids = self._owned(s, page_ids, "return")
            ticket = None
            if evict_request_id:
                ticket = self._books.tickets.get(evict_request_id)
                if ticket is None or ticket.session_id != s.session_id:
                    raise NotFoundError(f"no eviction request {evict_request_id} for this session")
            for p in ids:
                if s.pages[p] == "delivering":
                    raise FailedPreconditionError(f"page {p} is still being delivered")
            for p in ids:
                del self._books.owner[p]
                del s.pages[p]
            s.counters.pages_returned += len(ids)
            self._books.counters.pages_returned_total += len(ids)
            # Any return while asked to evict counts toward the request (the client cannot
            # always tell which request a freed page answers).
            credit = min(len(ids), s.outstanding_evict)
            if credit:
                s.outstanding_evict -= credit
                s.counters.evict_pages_returned += credit
                self._books.counters.evict_pages_returned_total += credit
                for t in sorted(self._books.tickets.values(), key=lambda t: (t is not ticket, t.request_id)):
                    if credit == 0:
                        break
                    if t.session_id == s.session_id and t.open and t.returned < t.asked:
                        n = min(credit, t.asked - t.returned)
                        t.returned += n
                        credit -= n
            return ids
