"""The node: the daemon's page pool, its sessions' connections, and the pressure protocol.

Owns: building the I/O around the ledger from its parts, one concern per class, and holding
them (composition: each part is handed the parts it uses at construction; none inherits from
another): ``changes`` (node_changes: waking waiters, telling the state file), ``reclaim``
(node_reclaim: pages let go, revoked, retained or released), ``peers`` (node_peers: each
session's connection and events, a session's end), ``connections`` (node_connections: the
side channel, accept, hello, a session's life), ``pressure`` (node_pressure: eviction
requests, deadlines, kills; Note [Missed eviction deadline]) and ``leases`` (node_leases:
leases and pages given back), all on the event loop. Callers use the parts
(``node.leases.lease(...)``, ``node.peers.watch(...)``); :class:`Node` adds only ``close``.
Invariants: a page is in the page pool exactly while the ledger has an owner for it (pages are
created after the ledger admits a lease and released as soon as the ledger lets go of them, or
at once when creating, recording or delivering a lease fails in any way);
a session ends, and its pages go back to the page pool, as soon as its connection closes or its
process exits (EOF or pidfd readable), whichever comes first. Pages given back are released,
never handed to another session, so no bytes cross between sessions (memfd pages start
zeroed; see docs/service.md on cuda pages). Nothing of the node blocks the event loop on a peer.
"""

from __future__ import annotations

from vtalloc.allocator.page_pool import PagePool

from .ledger import Ledger
from .limits import SessionLimits
from .loop_stalls import LoopStalls
from .node_changes import NodeChanges
from .node_connections import NodeConnections
from .node_events import EvictEvent, EvictOutcome, QuotaEvent, ShutdownEvent
from .node_leases import NodeLeases
from .node_peers import NodePeers, Peer
from .node_pressure import NodePressure
from .node_reclaim import NodeReclaim

__all__ = ["Node", "EvictEvent", "QuotaEvent", "ShutdownEvent", "EvictOutcome", "Peer"]


class Node:
    def __init__(self, pool: PagePool, ledger: Ledger, *, kill_on_missed_deadline: bool = True,
                 limits: SessionLimits | None = None, principal_by: str = "uid") -> None:
        self.pool = pool
        self.ledger = ledger
        self.stalls = LoopStalls()
        self.changes = NodeChanges()
        self.reclaim = NodeReclaim(pool, ledger.books, self.changes)
        self.peers = NodePeers(ledger, self.reclaim)
        self.connections = NodeConnections(ledger, self.peers, self.stalls, limits=limits, principal_by=principal_by)
        self.pressure = NodePressure(ledger, self.peers, self.changes, self.stalls,
                                     kill_on_missed_deadline=kill_on_missed_deadline)
        self.leases = NodeLeases(ledger, pool, self.peers, self.reclaim, self.pressure, self.changes)

    async def close(self) -> None:
        """End every session (their mapped pages stay valid in the clients) and the page pool."""
        self.stalls.stop()
        self.peers.end_all()
        self.reclaim.close()   # retained pages go with the pool below
        await self.connections.close()
        self.pool.close()
