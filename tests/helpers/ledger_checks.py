"""What tests ask of a ledger that the daemon never does: its invariants checked, its counters and held pages.

Owns: the test-facing reads of a :class:`vtalloc.server.ledger.Ledger` (the production class
carries no method used only by tests): ``check_invariants`` (server/ledger.py's invariants,
raised as InternalError when broken), ``node_counters`` and ``held_pages``.
Invariants: reads only, each under the books' lock; changes nothing.
"""

from __future__ import annotations

import dataclasses

from vtalloc.allocator.errors import InternalError
from vtalloc.server.ledger import Ledger


def check_invariants(ledger: Ledger) -> None:
    """Raise InternalError if the ledger's books break an invariant of server/ledger.py."""
    b = ledger.books
    with b.lock:
        held = 0
        for s in b.sessions.values():
            for p in s.pages:
                if b.owner.get(p) is not s:
                    raise InternalError(f"page {p} of session {s.session_id} has another owner")
            held += len(s.pages)
        if held != len(b.owner):
            raise InternalError(f"{len(b.owner)} owned pages but sessions hold {held}")
        if b.unavailable() > b.geometry.capacity_pages:
            raise InternalError("more pages held, inherited and retained than the node's capacity")
        if any(p in b.owner for r in b.retained.values() for p in r.pages):
            raise InternalError("a retained page is also a session's")
        page = b.geometry.page_bytes
        if sum(-(-q.min_bytes // page) for q in ledger.quotas.all()) > b.geometry.capacity_pages:
            raise InternalError("quota minimums exceed the node's capacity")


def node_counters(ledger: Ledger) -> dict[str, int]:
    """The node's counters by name (what stats' ``counters`` shows)."""
    with ledger.books.lock:
        return dataclasses.asdict(ledger.books.counters)


def held_pages(ledger: Ledger) -> int:
    """Pages leased to sessions (delivering or leased), retained and inherited ones aside."""
    with ledger.books.lock:
        return len(ledger.books.owner)
