"""The node: the daemon's page pool, its sessions' connections, and the pressure protocol.

Owns: the composition of the I/O around the ledger, on the event loop, one concern per module,
each a class over node_peers (the shared state, a session's end, its events):
node_connections (the side channel: accept, hello, a session's life), node_pressure (eviction
requests, deadlines, kills; Note [Missed eviction deadline]) and node_leases (leases and pages
given back, over node_pressure); :class:`Node` adds ``close``.
Invariants: a page is in the page pool exactly while the ledger has an owner for it (pages are
created after the ledger admits a lease and released as soon as the ledger lets go of them, or
at once when creating, recording or delivering a lease fails in any way);
a session ends, and its pages go back to the page pool, as soon as its connection closes or its
process exits (EOF or pidfd readable), whichever comes first. Pages given back are released,
never handed to another session, so no bytes cross between sessions (memfd pages start
zeroed; see docs/service.md on cuda pages).
"""

from __future__ import annotations

import asyncio
import os

from .node_connections import NodeConnections
from .node_events import EvictEvent, EvictOutcome, QuotaEvent, ShutdownEvent
from .node_leases import NodeLeases
from .node_peers import _Peer

__all__ = ["Node", "EvictEvent", "QuotaEvent", "ShutdownEvent", "EvictOutcome", "_Peer"]


class Node(NodeConnections, NodeLeases):
    async def close(self) -> None:
        """End every session (their mapped pages stay valid in the clients) and the page pool."""
        self._closing = True
        self.stalls.stop()
        for peer in list(self._peers.values()):
            self._end(peer, clean=True)
        loop = asyncio.get_running_loop()
        for pid, fd in list(self._retainers.items()):  # retained pages go with the pool below
            loop.remove_reader(fd)
            os.close(fd)
            del self._retainers[pid]
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.pool.close()
