"""The node's peers: one session's connection, pidfd and event queue, and what they share.

Owns: the node's state (the peers by session id, the page pool, the ledger, the slots of
limits.py, the wake-up future), a session's end (its pages released to the page pool, its
queue closed), waiting for pages to come back (``_wait``), and the events queued for a
session (``watch``: quota changes, eviction requests, shutdown; node_events.py).
The other concerns are classes over this one: node_connections (the side channel),
node_pressure (eviction requests, deadlines and kills), node_leases (leases and pages given
back), composed into :class:`~.node.Node`.
Invariants: a page is in the page pool exactly while the ledger has an owner for it (a session,
or a process retaining it); a page a client may still reach is revoked before it is released,
or retained until that process exits (``_let_go``; page_reclaim.py, Note [Memory a client can
still reach]), except at an orderly stop; pages the
ledger lets go of are released at once (``_release_pages``), never handed to another session,
so no bytes cross between sessions (memfd pages start zeroed; see docs/service.md on cuda
pages); every release and every ended session wakes every ``_wait``; a session is watched
by at most one stream at a time; what waits for a session's watch is bounded whether or not
it ever reads (node_events.py, Note [Bounded event queues]).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import AsyncIterator, Callable

from vtalloc.allocator.page_pool import PagePool

from .ledger import Ledger
from .limits import SESSIONS_BURST, SESSIONS_PER_S, RatePacer, RefusalLog, SessionLimits, UidSlots
from .loop_stalls import LoopStalls
from .node_events import EventBox, QuotaEvent, ShutdownEvent
from .page_reclaim import RETAIN, REVOKE, revoke_page
from .principals import pidfd_exited
from .protocol.errors import FailedPreconditionError, ServiceUnavailableError
from .quota import Quota
from .records import Session
from .side_channel import AsyncConnection, Closer

__all__ = ["NodePeers", "_Peer", "SEND_TIMEOUT_S"]

log = logging.getLogger("vtalloc.server")

SEND_TIMEOUT_S = 5.0


class _Peer:
    """One session's connection, pidfd and event queue."""

    def __init__(self, session: Session, conn: AsyncConnection, pidfd: int | None) -> None:
        self.session = session
        self.conn = conn
        self.pidfd = pidfd
        self.events = EventBox()  # bounded: node_events.py, Note [Bounded event queues]
        self.told_quota: Quota | None = None   # the last quota queued for it
        self.watching = False


class NodePeers:
    def __init__(self, pool: PagePool, ledger: Ledger, *, kill_on_missed_deadline: bool = True,
                 limits: SessionLimits | None = None, principal_by: str = "uid") -> None:
        self.pool = pool
        self.principal_by = principal_by  # "uid" or "pod" (principals.py)
        self.ledger = ledger
        self.kill_on_missed_deadline = kill_on_missed_deadline
        self.limits = limits = limits or SessionLimits()
        self._pending = UidSlots("side-channel connections waiting for their hello", "--max-pending-per-uid",
                                 limits.max_pending_per_uid)
        self._sessions = UidSlots("open sessions", "--max-sessions-per-uid", limits.max_sessions_per_uid)
        self._refusals = RefusalLog()
        self._opens = RatePacer(SESSIONS_PER_S, SESSIONS_BURST, limits.hello_timeout_s)  # limits.py
        self._unidentified = UidSlots("connections whose cgroup could not be read", "--principal-by pod", 0)
        self._closer = Closer()
        self.stalls = LoopStalls()
        self._peers: dict[str, _Peer] = {}
        self._wake: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self.reclaim = ledger.geometry.reclaim if ledger is not None else REVOKE  # page_reclaim.py
        self._retainers: dict[int, int] = {}     # pid -> pidfd of a process retaining pages (RETAIN)
        # Called whenever what client processes hold changes (state_keeper.py persists it).
        self.on_holdings_changed: Callable[[], None] = lambda: None

    def capacity_changed(self) -> None:
        """Pages became free outside the node's own sessions (an inherited holder exited)."""
        self._changed()

    def _changed(self) -> None:
        """Wake everyone waiting in _wait(): pages came back or a session ended."""
        self.on_holdings_changed()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        self._wake = None

    async def _wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds, re-checking at every _changed(); False at the timeout."""
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, timeout_s)
        while not predicate():
            remaining = end - loop.time()
            if remaining <= 0:
                return False
            if self._wake is None:
                self._wake = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._wake), remaining)
            except asyncio.TimeoutError:
                return predicate()
        return True

    def _end(self, peer: _Peer, *, clean: bool) -> None:
        s = peer.session
        if self._peers.get(s.session_id) is not peer:
            return
        del self._peers[s.session_id]
        pages = self.ledger.end_session(s, clean=clean)
        if self._closing:
            self._release_pages(pages)   # an orderly stop: the clients keep what they mapped (no revoking)
        else:
            self._let_go(s, pages, peer.pidfd)
        if s.declared is not None and not self._closing:  # its scope's quota may rise again
            self.quota_changed(self.ledger.quota_for(s), s.uid)
        peer.events.put(None)
        peer.conn.close()
        if peer.pidfd is not None:
            os.close(peer.pidfd)
            peer.pidfd = None
        if s.kind == "client":
            how = "closed" if clean else "gone (reclaimed)"
            log.info("session %s %s: %d pages back to the page pool", s.session_id, how, len(pages))

    def _let_go(self, s: Session, pages: list[int], pidfd: int | None = None) -> None:
        """Pages no session of ``s``'s process holds any more, which it may still reach
        (page_reclaim.py, Note [Memory a client can still reach]): revoked then released, or
        retained until the process exits (``pidfd``: one to watch it by, duplicated here)."""
        if not pages:
            return
        if self.reclaim == RETAIN:
            self.ledger.retain(s, pages)
            self._watch_retainer(s, pidfd)
            self._changed()
            return
        kept = []
        for p in pages:
            try:
                revoke_page(self.pool, p)
            except Exception:  # noqa: BLE001 - not revoked: counted until the process exits instead
                log.exception("could not revoke page %d of session %s; it stays counted until pid %d exits",
                              p, s.session_id, s.pid)
                kept.append(p)
        self._release_pages([p for p in pages if p not in kept])
        if kept:
            self.ledger.retain(s, kept)
            self._watch_retainer(s, pidfd)

    def _watch_retainer(self, s: Session, pidfd: int | None) -> None:
        """Watch the exit of ``s``'s process, whose retained pages are then released."""
        if s.pid in self._retainers:
            return
        loop = asyncio.get_running_loop()
        try:
            fd = os.dup(pidfd) if pidfd is not None else os.pidfd_open(s.pid)
        except OSError:  # gone already
            self._retainer_exited(s.pid)
            return
        if pidfd_exited(fd):
            os.close(fd)
            self._retainer_exited(s.pid)
            return
        self._retainers[s.pid] = fd
        loop.add_reader(fd, self._retainer_exited, s.pid)

    def _retainer_exited(self, pid: int) -> None:
        fd = self._retainers.pop(pid, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        pages = self.ledger.forget_retained(pid)
        if pages:
            log.info("pid %d exited: %d pages it retained back to the page pool", pid, len(pages))
        self._release_pages(pages)

    def _release_pages(self, pages: list[int]) -> None:
        """Release ``pages`` to the page pool (their ids are never reused) and wake every waiter."""
        for p in pages:
            try:
                self.pool.release_page(p)
            except Exception:  # noqa: BLE001 - a page the page pool cannot release is logged, not fatal
                log.exception("could not release page %d", p)
        self._changed()

    # -- events -----------------------------------------------------------------------------
    async def watch(self, s: Session) -> AsyncIterator[object]:
        if s.kind != "client":
            raise FailedPreconditionError("an observer session receives no events")
        peer = self._peers.get(s.session_id)
        if peer is None:
            raise ServiceUnavailableError("the session ended")
        if peer.watching:
            raise FailedPreconditionError("this session is already watching its events")
        peer.watching = True
        try:
            while True:
                event = await peer.events.get()
                if event is None:
                    return
                yield event
                if isinstance(event, ShutdownEvent):
                    return
        finally:
            peer.watching = False

    def quota_changed(self, quota: Quota, uid: int | None = None) -> None:
        """Tell the principal's client sessions (only those of ``uid``, when given: the scope a
        declaration binds, ledger_quotas.py) the quota in force for each of them, once per scope
        and only to a session not yet told that quota: a hello costs the daemon one pass over
        its sessions, however many of that principal never watch."""
        in_force: dict[int, Quota] = {}
        for peer in list(self._peers.values()):
            s = peer.session
            if s.principal != quota.principal or s.kind != "client" or uid not in (None, s.uid):
                continue
            q = in_force.get(s.uid)
            if q is None:
                q = in_force[s.uid] = self.ledger.quota_for(s)
            if peer.told_quota != q:
                peer.told_quota = q
                peer.events.put(QuotaEvent(q))

    # -- shutdown ---------------------------------------------------------------------------
    def announce_shutdown(self, reason: str) -> None:
        self._closing = True
        for peer in self._peers.values():
            peer.events.put(ShutdownEvent(reason))
