"""The ledger: sessions, the pages leased to them, quotas, and eviction requests.

Owns the service's bookkeeping and every rule about it, with no I/O, no gRPC and no
asyncio, so each rule is testable alone (tests/test_service_ledger.py). The node (node.py)
does the I/O around it: it asks the ledger, creates or releases pages, and tells the ledger
what happened. What it answers are the frozen views of views.py.
Why this file is long: every rule about sessions, pages, quotas and who sees whom lives here,
under one lock, so that each can be checked against the others in one place.

Invariants (``check_invariants()``):
- every leased page id has exactly one owner, a live session, and is in that session's pages;
- the pages held by all sessions never exceed the node's capacity, and a lease is admitted only
  while they fit beside the pages *inherited*: those that live processes of a previous daemon
  still hold (state_file.py), counted until each such process exits;
- the quota minimums of all principals together fit in the node's capacity;
- a principal's pages never exceed its maximum because of a lease the ledger admitted
  (lowering a maximum later refuses new leases; it takes nothing away).
- a session sees, and acts on, only sessions of its own uid *and* principal (admins: all); under
  ``--principal-by pod`` a session is admin only if its uid is and its cgroup is exactly the
  daemon's own or under an ``--admin-cgroup`` (a pod's root is not the node's root);
- a principal's quota is the operator's (its own, else the default) lowered, per field, by what its
  live client sessions declared in their hellos (the lowest wins); a declaration never raises it.
Reports are untrusted: reports.py keeps their values in range and their sums in a uint64.
Page ids are never reused (the page pool hands out fresh ones), so an id seen once identifies a
page for the daemon's lifetime. Thread safety: every public method takes one lock (the
metrics thread reads while the event loop writes).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from typing import Callable, Iterable

from vtalloc.allocator.errors import InternalError, InvalidArgumentError

from .inherited import Inherited
from .protocol.errors import (
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    UnauthenticatedError,
    echo,
)
from .principals import under_cgroup
from .quota import PrincipalMap, Quota, check_principal, pod_principal
from .records import SESSION_KINDS, EvictTicket, Holder, NodeCounters, NodeGeometry, Session
from .reports import check_report, take_report
from .snapshot import device_view, page_views, pages_by_state, principal_view, session_view
from .views import (
    PAGE_STATES,
    PAGE_USES,
    ClientReport,
    DeviceView,
    NodeView,
    PageMapView,
    PageUseReport,
    SessionInfoView,
)

log = logging.getLogger("vtalloc.server")

__all__ = [
    "Ledger", "NodeGeometry", "Session", "ClientReport", "PageUseReport", "EvictTicket", "PAGE_STATES", "PAGE_USES",
    "SESSION_KINDS",
]

_SESSION_ID_BYTES = 6                      # 48 random bits, shown in stats
_TOKEN_BYTES = 16                          # 128 random bits: the secret a call carries


class Ledger:
    def __init__(self, geometry: NodeGeometry, *, default_quota: Quota | None = None,
                 quotas: Iterable[Quota] = (), principals: PrincipalMap = PrincipalMap(),
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
        self._ended_evicted: dict[str, int] = {}
        for q in quotas:
            self.set_quota(q.principal, q.min_bytes, q.max_bytes)

    # -- sessions ---------------------------------------------------------------------------
    def open_session(self, pid: int, uid: int, gid: int, kind: str, start_ticks: int = 0, *, cgroup: str = "",
                     pod: str | None = None, declared: tuple[int | None, int | None] | None = None) -> Session:
        """``pod``: the pod UID the kernel's cgroup path names (principals.py), which makes the
        principal ``pod:<uid>``; else the uid's. ``declared``: (min, max) from the hello, which can
        only lower the principal's quota (ignored for an observer)."""
        if kind not in SESSION_KINDS:
            raise InvalidArgumentError(f"session kind must be one of {', '.join(SESSION_KINDS)}, got {kind!r}")
        principal = pod_principal(pod) if pod else self._principals.principal_for(uid)
        with self._lock:
            token = secrets.token_hex(_TOKEN_BYTES)
            sid = secrets.token_hex(_SESSION_ID_BYTES)
            while sid in self._sessions:  # a clash is unlikely, never allowed
                sid = secrets.token_hex(_SESSION_ID_BYTES)
            s = Session(sid, token, pid, uid, gid, check_principal(principal), kind, self._clock(),
                        start_ticks=start_ticks, cgroup=cgroup, pod=pod,
                        declared=declared if kind == "client" else None)
            self._sessions[sid] = s
            self._by_token[token] = s
            if kind == "client":
                self._counters.sessions_total += 1
            return s

    def authenticate(self, token: str | None) -> Session:
        with self._lock:
            s = self._by_token.get(token or "")
            if s is None or not s.live:
                raise UnauthenticatedError(
                    "no live session for this call: open one on the side channel and send its token "
                    "as x-vtalloc-session")
            return s

    def is_admin(self, s: Session) -> bool:
        if s.uid not in self._admin_uids:
            return False
        if self._admin_cgroups is None:
            return True
        own, *more = self._admin_cgroups  # the daemon's own cgroup exactly (it may be "/"), then subtrees
        return bool(s.cgroup) and (s.cgroup == own or any(under_cgroup(s.cgroup, c) for c in more))

    def _sees(self, caller: Session, s: Session) -> bool:
        """Whether ``caller`` may see and act on ``s``: an admin, or the same uid and principal."""
        return self.is_admin(caller) or (s.uid == caller.uid and s.principal == caller.principal)

    def require_admin(self, s: Session, what: str) -> None:
        if not self.is_admin(s):
            raise PermissionDeniedError(f"{what} needs an admin uid; uid {s.uid} is not one")

    def session_for(self, caller: Session, session_id: str) -> Session:
        """The session ``session_id`` if ``caller`` may see it (same uid, or an admin)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or not s.live:
                raise NotFoundError(f"no session {echo(session_id)}")
            if not self._sees(caller, s):
                raise PermissionDeniedError(f"session {session_id} belongs to another uid or principal")
            return s

    def end_session(self, s: Session, *, clean: bool) -> list[int]:
        """Forget the session; returns the page ids it held, for the caller to release."""
        with self._lock:
            if not s.live:
                return []
            s.live = False
            del self._sessions[s.session_id]
            del self._by_token[s.token]
            pages = list(s.pages)
            for p in pages:
                del self._owner[p]
            s.pages.clear()
            for t in self._tickets.values():
                if t.session_id == s.session_id:
                    t.open = False
            if s.kind == "client":
                if clean:
                    self._counters.pages_returned_total += len(pages)
                else:
                    self._counters.reclaims_total += 1
                    self._counters.reclaimed_pages_total += len(pages)
            return pages

    def count_protocol_error(self) -> None:
        with self._lock:
            self._counters.protocol_errors_total += 1

    def count_kill(self) -> None:
        with self._lock:
            self._counters.kills_total += 1

    # -- quotas -----------------------------------------------------------------------------
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

    # -- leases -----------------------------------------------------------------------------
    def held_pages(self) -> int:
        with self._lock:
            return len(self._owner)

    def free_pages(self) -> int:
        with self._lock:
            return max(0, self.geometry.capacity_pages - len(self._owner) - self._inherited.pages)

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
            return self._inherited.holders(self._sessions.values())

    def admit(self, s: Session, pages: int) -> int:
        """Check a lease of ``pages``; returns how many pages the node is short (0: go ahead).

        Raises at once for a bad count, an observer session, or a lease past the maximum.
        """
        g = self.geometry
        if not 1 <= pages <= g.max_lease_pages:
            raise InvalidArgumentError(f"a lease asks for 1 to {g.max_lease_pages} pages, not {pages}")
        with self._lock:
            if s.kind != "client":
                raise FailedPreconditionError("an observer session cannot lease pages")
            q = self.quota_of(s.principal)
            used = self._principal_pages(s.principal)
            if (used + pages) * g.page_bytes > q.max_bytes:
                self._counters.quota_rejections_total += 1
                s.counters.quota_rejections += 1
                self._quota_rejections[s.principal] = self._quota_rejections.get(s.principal, 0) + 1
                log.info("lease of %d pages for session %s (%s, pid %d) refused: its principal holds %d pages, its "
                         "maximum is %d bytes", pages, s.session_id, s.principal, s.pid, used, q.max_bytes)
                raise QuotaExceededError(
                    f"{s.principal} holds {used} pages of {g.page_bytes} bytes; {pages} more would pass its "
                    f"maximum of {q.max_bytes} bytes", requested_bytes=pages * g.page_bytes,
                    capacity_bytes=q.max_bytes, mapped_bytes=used * g.page_bytes)
            return max(0, pages - (g.capacity_pages - len(self._owner) - self._inherited.pages))

    def within_guarantee(self, s: Session, pages: int) -> bool:
        """Whether a lease of ``pages`` keeps the principal within its guaranteed minimum."""
        with self._lock:
            q = self.quota_of(s.principal)
            return (self._principal_pages(s.principal) + pages) * self.geometry.page_bytes <= q.min_bytes

    def count_node_short(self) -> None:
        with self._lock:
            self._counters.node_short_rejections_total += 1

    def new_lease_id(self) -> int:
        with self._lock:
            n = self._next_lease
            self._next_lease += 1
            return n

    def add_pages(self, s: Session, page_ids: list[int]) -> None:
        """Record fresh pages as on their way to ``s``."""
        with self._lock:
            if not s.live:
                raise NotFoundError(f"session {s.session_id} has ended")
            if len(self._owner) + len(page_ids) + self._inherited.pages > self.geometry.capacity_pages:
                raise InternalError("the ledger would hold more pages than the node's capacity")
            if twice := [p for p in page_ids if p in self._owner]:  # checked first: a refusal records none
                raise InternalError(f"page {twice[0]} handed out twice")
            for p in page_ids:
                self._owner[p] = s
                s.pages[p] = "delivering"

    def mark_delivered(self, s: Session, page_ids: list[int]) -> None:
        with self._lock:
            for p in page_ids:
                if s.pages.get(p) == "delivering":
                    s.pages[p] = "leased"
            s.counters.leases += 1
            s.counters.pages_leased += len(page_ids)
            self._counters.leases_total += 1
            self._counters.pages_leased_total += len(page_ids)

    def drop_pages(self, s: Session, page_ids: list[int]) -> None:
        """Forget pages whose delivery failed (the caller releases them)."""
        with self._lock:
            for p in page_ids:
                if self._owner.get(p) is s:
                    del self._owner[p]
                    s.pages.pop(p, None)

    def _owned(self, s: Session, page_ids: Iterable[int], what: str) -> list[int]:
        ids = list(page_ids)
        if len(ids) > self.geometry.max_return_pages:
            raise InvalidArgumentError(f"{what} carries {len(ids)} page ids; at most {self.geometry.max_return_pages}")
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"{what} names a page more than once")
        for p in ids:
            owner = self._owner.get(p)
            if owner is None:
                raise NotFoundError(f"{what}: no leased page {p}")
            if owner is not s:
                raise PermissionDeniedError(f"{what}: page {p} belongs to another session")
        return ids

    def take_back(self, s: Session, page_ids: Iterable[int], evict_request_id: int = 0) -> list[int]:
        """Validate and remove returned pages (all or none); returns them for the caller to release."""
        with self._lock:
            if not s.live:
                raise NotFoundError(f"session {s.session_id} has ended")
            ids = self._owned(s, page_ids, "return")
            ticket = None
            if evict_request_id:
                ticket = self._tickets.get(evict_request_id)
                if ticket is None or ticket.session_id != s.session_id:
                    raise NotFoundError(f"no eviction request {evict_request_id} for this session")
            for p in ids:
                if s.pages[p] == "delivering":
                    raise FailedPreconditionError(f"page {p} is still being delivered")
            for p in ids:
                del self._owner[p]
                del s.pages[p]
            s.counters.pages_returned += len(ids)
            self._counters.pages_returned_total += len(ids)
            # Any return while asked to evict counts toward the request (the client cannot
            # always tell which request a freed page answers).
            credit = min(len(ids), s.outstanding_evict)
            if credit:
                s.outstanding_evict -= credit
                s.counters.evict_pages_returned += credit
                self._counters.evict_pages_returned_total += credit
                for t in sorted(self._tickets.values(), key=lambda t: (t is not ticket, t.request_id)):
                    if credit == 0:
                        break
                    if t.session_id == s.session_id and t.open and t.returned < t.asked:
                        n = min(credit, t.asked - t.returned)
                        t.returned += n
                        credit -= n
            return ids

    # -- reports ----------------------------------------------------------------------------
    def record_report(self, s: Session, report: ClientReport) -> None:
        """Take a client's report; one with a value out of range is refused whole (reports.py)
        and counted as a protocol error."""
        with self._lock:
            if s.kind != "client":
                raise FailedPreconditionError("an observer session has no pages to report")
            if not s.live:
                raise NotFoundError(f"session {s.session_id} has ended")
            try:
                check_report(report)
            except InvalidArgumentError:
                self._counters.protocol_errors_total += 1
                raise
            take_report(s, report, self._clock(), self._counters)

    # -- eviction ---------------------------------------------------------------------------
    def excess_pages(self, principal: str) -> int:
        """Pages the principal holds above its guaranteed minimum."""
        with self._lock:
            q = self.quota_of(principal)
            return max(0, self._principal_pages(principal) - q.min_bytes // self.geometry.page_bytes)

    def pick_victims(self, need: int, requester: Session | None) -> list[tuple[Session, int]]:
        """Whom to ask for ``need`` pages: principals above their minimum, most excess first.

        Pages already asked for are not asked again; the requester itself is never asked.
        The result may cover less than ``need`` (then the node cannot free enough).
        """
        with self._lock:
            by_principal: dict[str, list[Session]] = {}
            for s in self._sessions.values():
                if s.kind == "client" and s is not requester and s.pages:
                    by_principal.setdefault(s.principal, []).append(s)
            order = []
            for principal, sessions in by_principal.items():
                pending = sum(x.outstanding_evict for x in sessions)
                spare = self.excess_pages(principal) - pending
                if spare > 0:
                    order.append((spare, principal, sessions))
            order.sort(key=lambda t: (-t[0], t[1]))
            picked: list[tuple[Session, int]] = []
            for spare, _, sessions in order:
                for s in sorted(sessions, key=lambda x: (-(len(x.pages) - x.outstanding_evict), x.session_id)):
                    if need <= 0 or spare <= 0:
                        break
                    k = min(need, spare, len(s.pages) - s.outstanding_evict)
                    if k > 0:
                        picked.append((s, k))
                        need -= k
                        spare -= k
            return picked

    def open_eviction(self, s: Session, pages: int) -> EvictTicket:
        with self._lock:
            t = EvictTicket(self._next_ticket, s.session_id, pages)
            self._next_ticket += 1
            self._tickets[t.request_id] = t
            s.outstanding_evict += pages
            s.counters.evict_requests += 1
            s.counters.evict_pages_asked += pages
            self._counters.evict_requests_total += 1
            self._counters.evict_pages_asked_total += pages
            return t

    def close_eviction(self, t: EvictTicket, *, judge: bool) -> bool:
        """Close a request; with ``judge`` (its deadline passed and the pages are still needed),
        True if the session missed it (returned too little), counted as a deadline miss."""
        with self._lock:
            self._tickets.pop(t.request_id, None)
            s = self._sessions.get(t.session_id)
            missed = judge and t.returned < t.asked and s is not None and t.open
            t.open = False
            if s is not None:
                s.outstanding_evict = max(0, s.outstanding_evict - (t.asked - t.returned))
                if missed:
                    s.counters.deadline_misses += 1
            if missed:
                self._counters.deadline_misses_total += 1
            return missed

    # -- views ------------------------------------------------------------------------------
    def _info(self, s: Session) -> SessionInfoView:
        g = self.geometry
        return SessionInfoView(s.session_id, s.pid, s.uid, s.principal, s.kind, g.backend, g.device, g.page_bytes,
                               g.capacity_bytes, g.host_capacity_bytes, self.quota_of(s.principal), len(s.pages),
                               g.evict_deadline_s, self.is_admin(s))

    def session_info(self, s: Session) -> SessionInfoView:
        with self._lock:
            return self._info(s)

    def _device(self) -> DeviceView:
        return device_view(self.geometry, self._sessions.values(), len(self._owner), self._inherited.pages,
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
            return self.node_view(None), by_state

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dataclasses.asdict(self._counters)

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
            if held > self.geometry.capacity_pages:
                raise InternalError("more pages held than the node's capacity")
            page = self.geometry.page_bytes
            if sum(-(-q.min_bytes // page) for q in self._quotas.values()) > self.geometry.capacity_pages:
                raise InternalError("quota minimums exceed the node's capacity")
