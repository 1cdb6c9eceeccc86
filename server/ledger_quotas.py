"""The ledger's quotas: each principal's guaranteed minimum and hard maximum, as in force.

Owns: the operator's quotas (set at start or by ``SetQuota``) and the default, the quota in
force for a principal and for one session, the pages a principal (and one declaring scope)
holds, what it holds above its minimum, and the leases each principal had refused by a quota.
Holds the books (ledger_books.py), whose sessions and retained pages it counts.
Invariants: every public method takes the books' lock; the quota minimums of all principals
together fit in the node's capacity (a ``set`` that would break it is refused and changes
nothing); a principal's pages never pass the operator's maximum (its own, else the default); a quota a client declares in its
hello binds only its *scope*, the client sessions of its principal **and its uid**
(Note [Declared quotas bind their own uid]), lowered per field to the lowest declaration
alive there, never raised.

Note [Declared quotas bind their own uid]
-----------------------------------------
A client may declare ``VTALLOC_QUOTA_MIN``/``MAX`` (protocol/declared_quota.py) to lower its
quota, e.g. a pod's spec lowering the pod's. The declaration used to lower the whole
principal's: under ``--principal team=1001,1002`` one member declaring 0:0 set the other
member's quota to 0:0 as long as it lived, and a declared minimum of 0 made the other
member's pages evictable. Uids do not trust each other (the side channel's SO_PEERCRED is
what tells them apart), so a declaration now binds its scope: the sessions of its principal
and its uid. The scope's pages must stay under the lowest maximum declared in it (and the
principal's, under the operator's maximum); the scope's pages above the lowest minimum
declared in it are not guaranteed (they are asked back first); no other scope is touched.
A principal of one uid (``uid:N``; a pod whose processes share a uid) is one scope, so there
nothing changed. ``of(principal)`` is what binds every live member: lowered by a
scope's declarations only while all of the principal's live client sessions are that scope.
"""

from __future__ import annotations

import logging

from vtalloc.allocator.errors import InvalidArgumentError

from .ledger_books import LedgerBooks
from .quota import Quota, check_principal
from .records import Session

__all__ = ["LedgerQuotas"]

log = logging.getLogger("vtalloc.server")


class LedgerQuotas:
    def __init__(self, books: LedgerBooks, default_quota: Quota | None = None) -> None:
        self._books = books
        cap = books.geometry.capacity_bytes
        self._default = (default_quota or Quota("", 0, cap)).keepable(cap)
        self._quotas: dict[str, Quota] = {}
        self._rejections: dict[str, int] = {}

    def operator(self, principal: str) -> Quota:
        """The operator's quota of ``principal``: its own, else the default."""
        with self._books.lock:
            return self._quotas.get(principal) or self._default.for_principal(principal)

    def _members(self, principal: str) -> list[Session]:
        return [s for s in self._books.sessions.values() if s.principal == principal and s.kind == "client"]

    def _scope_quota(self, principal: str, uid: int) -> Quota:
        """The operator's quota lowered by the declarations of the scope (principal, uid)."""
        q = self.operator(principal)
        for s in self._books.sessions.values():
            if s.declared is not None and s.principal == principal and s.uid == uid:
                q = q.lowered(*s.declared)
        return q

    def of(self, principal: str) -> Quota:
        """The principal's quota as it binds every live member: the operator's, lowered by the
        declarations of one scope only while all of its live client sessions are that scope
        (Note [Declared quotas bind their own uid])."""
        with self._books.lock:
            uids = {s.uid for s in self._members(principal)}
            if len(uids) == 1:
                return self._scope_quota(principal, uids.pop())
            return self.operator(principal)

    def for_session(self, s: Session) -> Quota:
        """The quota in force for session ``s``: its principal's, lowered by its scope's declarations."""
        with self._books.lock:
            return self._scope_quota(s.principal, s.uid)

    def scope_of(self, s: Session) -> list[Session]:
        """The live client sessions a declaration of ``s`` binds: its principal's, of its uid."""
        with self._books.lock:
            return [x for x in self._members(s.principal) if x.uid == s.uid]

    def all(self) -> tuple[Quota, ...]:
        """The operator's quotas, by principal (the default aside)."""
        with self._books.lock:
            return tuple(self._quotas[p] for p in sorted(self._quotas))

    @property
    def default(self) -> Quota:
        return self._default

    def set(self, principal: str, min_bytes: int, max_bytes: int) -> Quota:
        check_principal(principal)
        q = Quota(principal, min_bytes, max_bytes)
        page, cap = self._books.geometry.page_bytes, self._books.geometry.capacity_pages
        with self._books.lock:
            others = {p: x for p, x in self._quotas.items() if p != principal}
            mins = sum(-(-x.min_bytes // page) for x in others.values()) + -(-q.min_bytes // page)
            if mins > cap:
                raise InvalidArgumentError(
                    f"quota minimums would add up to {mins} pages, more than the node's {cap}: "
                    "a guarantee the node cannot keep")
            old = self._quotas.get(principal, self._default)
            self._quotas[principal] = q
        log.info("quota of %s set: min %d bytes, max %d bytes (was min %d, max %d)", principal, q.min_bytes,
                 q.max_bytes, old.min_bytes, old.max_bytes)
        return q

    def count_rejection(self, s: Session) -> None:
        """A lease of ``s`` refused by a quota: counted for the node, the session and its principal."""
        with self._books.lock:
            self._books.counters.quota_rejections_total += 1
            s.counters.quota_rejections += 1
            self._rejections[s.principal] = self._rejections.get(s.principal, 0) + 1

    def rejections(self) -> dict[str, int]:
        """Leases refused by a quota, by principal (those refused at least once)."""
        with self._books.lock:
            return dict(self._rejections)

    def _principal_pages(self, principal: str) -> int:
        """Pages its sessions hold and its processes retain (page_reclaim.py: they may still reach them)."""
        b = self._books
        return (sum(len(s.pages) for s in b.sessions.values() if s.principal == principal)
                + sum(len(r.pages) for r in b.retained.values() if r.principal == principal))

    def _scope_pages(self, principal: str, uid: int) -> int:
        b = self._books
        return (sum(len(s.pages) for s in b.sessions.values() if s.principal == principal and s.uid == uid)
                + sum(len(r.pages) for r in b.retained.values() if r.principal == principal and r.uid == uid))

    def over_maximum(self, s: Session, pages: int) -> tuple[Quota, int] | None:
        """(the maximum that ``pages`` more would pass, what it bounds now), or None: the
        principal's pages under the operator's maximum, the scope's under its declared one."""
        with self._books.lock:
            page = self._books.geometry.page_bytes
            q = self.operator(s.principal)
            used = self._principal_pages(s.principal)
            if (used + pages) * page > q.max_bytes:
                return q, used
            scoped = self._scope_quota(s.principal, s.uid)
            used = self._scope_pages(s.principal, s.uid)
            if (used + pages) * page > scoped.max_bytes:
                return scoped, used
            return None

    def _protected_pages(self, principal: str) -> int:
        """The principal's pages its guarantee covers: up to the operator's minimum, where each
        scope that declared a lower minimum is covered only up to that one."""
        page = self._books.geometry.page_bytes
        op_min = self.operator(principal).min_bytes // page
        covered = 0
        for uid in {s.uid for s in self._members(principal)}:
            held = self._scope_pages(principal, uid)
            covered += min(held, self._scope_quota(principal, uid).min_bytes // page)
        return min(op_min, covered)

    def excess_pages(self, principal: str) -> int:
        """Pages the principal holds above its guaranteed minimum (Note [Declared quotas bind their own uid])."""
        with self._books.lock:
            return max(0, self._principal_pages(principal) - self._protected_pages(principal))

    def scope_excess_pages(self, s: Session) -> int:
        """Pages ``s``'s scope holds above the minimum it declared (0 when it declared none):
        these are asked back before any other member's."""
        with self._books.lock:
            if not any(x.declared is not None and x.declared[0] is not None for x in self.scope_of(s)):
                return 0
            page = self._books.geometry.page_bytes
            return max(0, self._scope_pages(s.principal, s.uid)
                       - self._scope_quota(s.principal, s.uid).min_bytes // page)

    def within_guarantee(self, s: Session, pages: int) -> bool:
        """Whether a lease of ``pages`` keeps the principal within its guaranteed minimum, and
        the session's scope within the minimum it declared."""
        with self._books.lock:
            page = self._books.geometry.page_bytes
            if (self._principal_pages(s.principal) + pages) * page > self.operator(s.principal).min_bytes:
                return False
            return (self._scope_pages(s.principal, s.uid) + pages) * page <= self.for_session(s).min_bytes
