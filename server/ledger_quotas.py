"""The ledger's quotas: each principal's guaranteed minimum and hard maximum, as in force.

Owns: the operator's quotas (set at start or by ``SetQuota``), the quota in force for a
principal, the pages a principal holds, and what it holds above its minimum.
Invariants: the quota minimums of all principals together fit in the node's capacity (a
``set_quota`` that would break it is refused and changes nothing); a principal's quota is
the operator's (its own, else the default) lowered, per field, by what its live client
sessions declared in their hellos (the lowest wins); a declaration never raises it.
"""

from __future__ import annotations

import logging

from vtalloc.allocator.errors import InvalidArgumentError

from .ledger_sessions import LedgerSessions
from .quota import Quota, check_principal
from .records import Session

__all__ = ["LedgerQuotas"]

log = logging.getLogger("vtalloc.server")


class LedgerQuotas(LedgerSessions):
    def quota_of(self, principal: str) -> Quota:
        """The principal's quota: the operator's, lowered by its live client sessions' declarations."""
        with self._lock:
            q = self._quotas.get(principal) or self._default_quota.for_principal(principal)
            for s in self._sessions.values():
                if s.declared is not None and s.principal == principal:
                    q = q.lowered(*s.declared)
            return q

    def quotas(self) -> tuple[Quota, ...]:
        with self._lock:
            return tuple(self._quotas[p] for p in sorted(self._quotas))

    @property
    def default_quota(self) -> Quota:
        return self._default_quota

    def set_quota(self, principal: str, min_bytes: int, max_bytes: int) -> Quota:
        check_principal(principal)
        q = Quota(principal, min_bytes, max_bytes)
        page, cap = self.geometry.page_bytes, self.geometry.capacity_pages
        with self._lock:
            others = {p: x for p, x in self._quotas.items() if p != principal}
            mins = sum(-(-x.min_bytes // page) for x in others.values()) + -(-q.min_bytes // page)
            if mins > cap:
                raise InvalidArgumentError(
                    f"quota minimums would add up to {mins} pages, more than the node's {cap}: "
                    "a guarantee the node cannot keep")
            old = self._quotas.get(principal, self._default_quota)
            self._quotas[principal] = q
        log.info("quota of %s set: min %d bytes, max %d bytes (was min %d, max %d)", principal, q.min_bytes,
                 q.max_bytes, old.min_bytes, old.max_bytes)
        return q

    def _principal_pages(self, principal: str) -> int:
        return sum(len(s.pages) for s in self._sessions.values() if s.principal == principal)


    def excess_pages(self, principal: str) -> int:
        """Pages the principal holds above its guaranteed minimum."""
        with self._lock:
            q = self.quota_of(principal)
            return max(0, self._principal_pages(principal) - q.min_bytes // self.geometry.page_bytes)


    def within_guarantee(self, s: Session, pages: int) -> bool:
        """Whether a lease of ``pages`` keeps the principal within its guaranteed minimum."""
        with self._lock:
            q = self.quota_of(s.principal)
            return (self._principal_pages(s.principal) + pages) * self.geometry.page_bytes <= q.min_bytes
