"""The node's leases: serving a lease (asking for relief when short) and delivering its pages,
and taking the pages a session gives back.

Owns: a lease from admission to delivery (pages created in the page pool, recorded in the
ledger, their descriptors sent on the session's side channel in batches), and pages given
back (``give_back``, the ``Return`` RPC's work). Holds the ledger, the page pool, the node's
peers (node_peers.py), its reclaim (node_reclaim.py), its pressure protocol
(node_pressure.py: relief when the node is short) and its changes (node_changes.py).
Invariants: pages are created only after the ledger admits a lease (a process's own retained
pages are leased to it again first), and released to the page pool at once when creating or
recording it fails in any way (a cancellation too), or let go as given back when delivering
fails (some may have reached the client: page_reclaim.py);
what client processes hold is reported (``on_holdings_changed``) before delivery, so a crash
never under-counts; a lease answers before its RPC's deadline (REPLY_MARGIN_S).
"""

from __future__ import annotations

import asyncio
import logging
import os

from vtalloc.allocator.errors import OutOfMemoryError
from vtalloc.allocator.page_pool import PagePool

from .ledger import Ledger
from .node_changes import NodeChanges
from .node_peers import SEND_TIMEOUT_S, NodePeers, Peer
from .node_pressure import KILL_WAIT_S, NodePressure
from .node_reclaim import NodeReclaim
from .protocol.errors import NodeShortError, ServiceUnavailableError
from .protocol.side_channel import MAX_FDS_PER_MESSAGE
from .records import Session

__all__ = ["NodeLeases"]

log = logging.getLogger("vtalloc.server")

REPLY_MARGIN_S = 0.2  # a lease stops waiting this long before its RPC's deadline, to answer in time


class NodeLeases:
    def __init__(self, ledger: Ledger, pool: PagePool, peers: NodePeers, reclaim: NodeReclaim,
                 pressure: NodePressure, changes: NodeChanges) -> None:
        self._ledger = ledger
        self._pool = pool
        self._peers = peers
        self._reclaim = reclaim
        self._pressure = pressure
        self._changes = changes

    async def lease(self, s: Session, pages: int, time_left_s: float | None) -> tuple[int, list[int]]:
        loop = asyncio.get_running_loop()
        budget = self._ledger.geometry.evict_deadline_s + KILL_WAIT_S
        if time_left_s is not None:
            budget = min(budget, max(0.0, time_left_s - REPLY_MARGIN_S))
        deadline = loop.time() + budget
        asked = False
        while True:
            short = self._ledger.leases.admit(s, pages)
            if not short:
                break
            if asked or loop.time() >= deadline:
                self._ledger.leases.count_node_short()
                log.warning("lease of %d pages for session %s (%s, pid %d) refused: the node is %d pages short",
                            pages, s.session_id, s.principal, s.pid, short)
                raise NodeShortError(
                    f"the node is {short} pages short and other sessions did not free enough in time",
                    requested_bytes=pages * self._ledger.geometry.page_bytes,
                    capacity_bytes=self._ledger.geometry.capacity_bytes)
            await self._pressure.relieve(s, pages, short, deadline)
            asked = True
        peer = self._peers.get(s.session_id)
        if peer is None:
            raise ServiceUnavailableError("the session ended")
        return await self._deliver(peer, pages)

    async def _deliver(self, peer: Peer, pages: int) -> tuple[int, list[int]]:
        s = peer.session
        reused = self._ledger.books.take_retained(s, pages)   # its process may still reach these: no new memory
        created: list[int] = []
        try:
            for _ in range(pages - len(reused)):
                created.append(self._pool.create_page())
            self._ledger.leases.add_pages(s, reused + created)
        except BaseException as e:
            # Any failure, not only out-of-memory (a driver error, a cancellation): the pages
            # created so far are on no session's books, so they go back to the page pool now;
            # kept, the ledger would count them free while the pool holds them (the daemon then
            # never leased again). None was sent yet; the reused ones stay retained.
            self._reclaim.release_pages(created)
            self._ledger.books.retain(s, reused)
            if isinstance(e, OutOfMemoryError):
                self._ledger.leases.count_node_short()
            raise
        ids = reused + created
        self._changes.on_holdings_changed()  # recorded before delivery: a crash from here on never under-counts
        lease_id = self._ledger.leases.new_id()
        try:
            for i in range(0, len(ids), MAX_FDS_PER_MESSAGE):
                batch = ids[i:i + MAX_FDS_PER_MESSAGE]
                fds: list[int] = []
                try:
                    for p in batch:
                        fds.append(self._pool.export_page(p))
                    await peer.conn.send({"t": "pages", "lease_id": lease_id, "page_ids": batch}, fds,
                                         timeout_s=SEND_TIMEOUT_S)
                finally:
                    for fd in fds:
                        os.close(fd)
        except BaseException as e:
            # Not delivered (client gone, not reading, or cancelled): some descriptors may have
            # reached the client, so the pages are let go as any it gave back (revoked, or
            # retained until its process exits: page_reclaim.py).
            self._ledger.leases.drop_pages(s, ids)
            self._reclaim.let_go(s, ids, peer.pidfd)
            if isinstance(e, (OSError, EOFError, TimeoutError)):
                raise ServiceUnavailableError(f"could not deliver pages to session {s.session_id}: {e}") from None
            raise
        self._ledger.leases.mark_delivered(s, ids)
        return lease_id, ids

    def give_back(self, s: Session, page_ids: list[int], evict_request_id: int) -> int:
        """The Return RPC: the pages leave the session's books and are let go (revoked and
        released, or retained until its process exits: page_reclaim.py)."""
        ids = self._ledger.leases.give_back(s, page_ids, evict_request_id)
        self._reclaim.let_go(s, ids, self._peers.pidfd_of(s))
        return len(ids)
