"""The node's peers: each session's connection, pidfd and event queue, and a session's end.

Owns: the peers by session id (a :class:`Peer` per live session the node serves), whether
the node is closing, a session's end (its pages let go by the node's reclaim, its queue
closed), and the events queued for a session (``watch``: quota changes, eviction requests,
shutdown; node_events.py). Holds the ledger and the node's reclaim (node_reclaim.py).
Invariants: a session ends at most once, and then its pages leave the ledger and are let go
at once (revoked and released, or retained until its process exits; released as they are at
an orderly stop), which wakes every waiter; a session is watched by at most one stream at a
time; what waits for a session's watch is bounded whether or not it ever reads
(node_events.py, Note [Bounded event queues]).
"""

from __future__ import annotations

import logging
import os
from typing import AsyncIterator

from .ledger import Ledger
from .node_events import EventBox, QuotaEvent, ShutdownEvent
from .node_reclaim import NodeReclaim
from .protocol.errors import FailedPreconditionError, ServiceUnavailableError
from .quota import Quota
from .records import Session
from .side_channel import AsyncConnection

__all__ = ["NodePeers", "Peer", "SEND_TIMEOUT_S"]

log = logging.getLogger("vtalloc.server")

SEND_TIMEOUT_S = 5.0


class Peer:
    """One session's connection, pidfd and event queue."""

    def __init__(self, session: Session, conn: AsyncConnection, pidfd: int | None) -> None:
        self.session = session
        self.conn = conn
        self.pidfd = pidfd
        self.events = EventBox()  # bounded: node_events.py, Note [Bounded event queues]
        self.told_quota: Quota | None = None   # the last quota queued for it
        self.watching = False


class NodePeers:
    def __init__(self, ledger: Ledger, reclaim: NodeReclaim) -> None:
        self._ledger = ledger
        self._reclaim = reclaim
        self._peers: dict[str, Peer] = {}
        self.closing = False

    def add(self, peer: Peer) -> Peer:
        self._peers[peer.session.session_id] = peer
        return peer

    def get(self, session_id: str) -> Peer | None:
        return self._peers.get(session_id)

    def pidfd_of(self, s: Session) -> int | None:
        peer = self._peers.get(s.session_id)
        return peer.pidfd if peer is not None else None

    def end(self, peer: Peer, *, clean: bool) -> None:
        s = peer.session
        if self._peers.get(s.session_id) is not peer:
            return
        del self._peers[s.session_id]
        pages = self._ledger.sessions.end(s, clean=clean)
        if self.closing:
            self._reclaim.release_pages(pages)   # an orderly stop: the clients keep what they mapped (no revoking)
        else:
            self._reclaim.let_go(s, pages, peer.pidfd)
        if s.declared is not None and not self.closing:  # its scope's quota may rise again
            self.quota_changed(self._ledger.quotas.for_session(s), s.uid)
        peer.events.put(None)
        peer.conn.close()
        if peer.pidfd is not None:
            os.close(peer.pidfd)
            peer.pidfd = None
        if s.kind == "client":
            how = "closed" if clean else "gone (reclaimed)"
            log.info("session %s %s: %d pages back to the page pool", s.session_id, how, len(pages))

    def end_all(self) -> None:
        """An orderly stop: every session ends clean, the clients keeping what they mapped."""
        self.closing = True
        for peer in list(self._peers.values()):
            self.end(peer, clean=True)

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
                q = in_force[s.uid] = self._ledger.quotas.for_session(s)
            if peer.told_quota != q:
                peer.told_quota = q
                peer.events.put(QuotaEvent(q))

    # -- shutdown ---------------------------------------------------------------------------
    def announce_shutdown(self, reason: str) -> None:
        self.closing = True
        for peer in self._peers.values():
            peer.events.put(ShutdownEvent(reason))
