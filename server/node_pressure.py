"""The node's pressure protocol: asking sessions to evict when the node runs short, judging
them at their deadline, and killing a laggard when a guarantee needs it.

Owns: eviction requests to sessions (the pressure targets the ledger picks, ledger_victims.py),
forced eviction (``vtalloc evict``), and the decision when one does not answer in time
(Note [Missed eviction deadline]). Holds the ledger, the node's peers (node_peers.py), its
changes (node_changes.py: waiting for pages to come back) and the loop's stall watch.
Invariants: a session is asked only through its event queue and judged only by the ledger's
ticket (``close_eviction``), once; the daemon's own stalls never make a client late; a kill is
SIGKILL through the session's pidfd (its pid only when it has none), and is counted.

Note [Missed eviction deadline]
-------------------------------
A session asked to evict has ``evict_deadline_s`` to return the pages, and the request tells
it exactly that (less only when the waiting lease's own RPC deadline comes sooner); it is
judged then. If it misses:
- when the waiting lease is within its principal's guaranteed minimum, the guarantee wins:
  the daemon kills the laggard (SIGKILL through its pidfd; the daemon cannot revoke pages
  already mapped in another process), reclaims its pages, and serves the lease;
- otherwise (the requester is borrowing above its minimum), the lease fails with
  RESOURCE_EXHAUSTED (NodeShortError) and the laggard keeps running.
The daemon's own stalls never make a client late: loop_stalls.wait_judged extends the
deadline by them and re-checks; with no room left before the lease's deadline, nobody is judged.
After a kill the lease waits up to KILL_WAIT_S more for the
laggard's pages. Every miss and every kill is counted (metrics, stats). ``vtalloc serve --no-kill`` makes
every miss fail the lease. Pages the laggard returns late still go back to the page pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from vtalloc.allocator.errors import InvalidArgumentError

from .ledger import Ledger
from .loop_stalls import LoopStalls, wait_judged
from .node_changes import NodeChanges
from .node_events import EvictEvent, EvictOutcome
from .node_peers import NodePeers, Peer
from .protocol.errors import FailedPreconditionError
from .records import EvictTicket, Session

__all__ = ["NodePressure", "KILL_WAIT_S"]

log = logging.getLogger("vtalloc.server")

KILL_WAIT_S = 2.0


class NodePressure:
    def __init__(self, ledger: Ledger, peers: NodePeers, changes: NodeChanges, stalls: LoopStalls, *,
                 kill_on_missed_deadline: bool = True) -> None:
        self._ledger = ledger
        self._peers = peers
        self._changes = changes
        self._stalls = stalls
        self.kill_on_missed_deadline = kill_on_missed_deadline

    async def relieve(self, requester: Session, pages: int, short: int, deadline: float) -> None:
        """Ask others for ``short`` pages by the eviction deadline (the configured one, or less
        when the lease's ``deadline`` is nearer); judge them then, enforce on a miss, and wait
        for killed sessions' pages until ``deadline``."""
        loop = asyncio.get_running_loop()
        victims = self._ledger.victims.pick(short, requester)
        if sum(k for _, k in victims) < short:
            return  # nobody can give enough back: the caller fails at once
        evict_by = min(deadline, loop.time() + self._ledger.geometry.evict_deadline_s)
        log.info("the node is %d pages short for %s: asking %s", short, requester.principal,
                 ", ".join(f"session {v.session_id} for {k}" for v, k in victims))
        asked = [self._ask(v, k, evict_by - loop.time()) for v, k in victims]
        tickets = [t for t in asked if t is not None]

        def enough() -> bool:
            return self._ledger.books.free_pages() >= pages

        answered = await wait_judged(self._changes.wait, self._stalls, enough, evict_by, deadline)
        if answered is not False:
            for t in tickets:
                self._ledger.victims.close_eviction(t, judge=False)
            if answered is None:
                log.warning("the daemon's event loop stalled during an eviction request; nobody is judged late, "
                            "and the lease of %d pages for %s fails", pages, requester.principal)
            return
        missed = [t for t in tickets if self._ledger.victims.close_eviction(t, judge=True)]
        if not missed:
            return
        if not (self.kill_on_missed_deadline and self._ledger.quotas.within_guarantee(requester, pages)):
            log.warning("%d session(s) missed an eviction deadline; lease of %d pages for %s fails",
                        len(missed), pages, requester.principal)
            return
        for t in missed:
            peer = self._peers.get(t.session_id)
            if peer is not None:
                self._kill(peer, f"missed an eviction deadline while {requester.principal} needed its guarantee")
        await self._changes.wait(enough, max(deadline - loop.time(), 0.0))

    def _ask(self, victim: Session, pages: int, deadline_s: float) -> EvictTicket | None:
        peer = self._peers.get(victim.session_id)
        if peer is None:
            return None
        t = self._ledger.victims.open_eviction(victim, pages)
        peer.events.put(EvictEvent(t.request_id, pages, max(0.0, deadline_s)))
        return t

    def _kill(self, peer: Peer, why: str) -> bool:
        s = peer.session
        try:
            if peer.pidfd is not None:
                signal.pidfd_send_signal(peer.pidfd, signal.SIGKILL)
            else:
                os.kill(s.pid, signal.SIGKILL)
        except OSError as e:
            log.error("could not kill pid %d of session %s (%s): %s", s.pid, s.session_id, why, e)
            return False
        self._ledger.books.count_kill()
        log.warning("killed pid %d of session %s: %s", s.pid, s.session_id, why)
        return True

    async def evict_session(self, admin: Session, session_id: str, pages: int, kill_on_miss: bool) -> EvictOutcome:
        self._ledger.sessions.require_admin(admin, "forced eviction")
        target = self._ledger.sessions.find(admin, session_id)
        if target.kind != "client":
            raise FailedPreconditionError("an observer session holds no pages")
        held = len(target.pages)
        asked = pages if pages else min(held, self._ledger.quotas.excess_pages(target.principal))
        if asked > held:
            raise InvalidArgumentError(f"session {session_id} holds {held} pages; cannot evict {asked}")
        if asked == 0:
            return EvictOutcome(0, 0, False, False)
        loop = asyncio.get_running_loop()
        deadline_s = self._ledger.geometry.evict_deadline_s
        log.info("forced eviction by uid %d: session %s (%s, pid %d) asked for %d of its %d pages within %.1f s%s",
                 admin.uid, session_id, target.principal, target.pid, asked, held, deadline_s,
                 ", or killed" if kill_on_miss else "")
        t = self._ask(target, asked, deadline_s)
        if t is None:
            raise FailedPreconditionError(f"session {session_id} has ended")
        end = loop.time() + deadline_s
        answered = await wait_judged(self._changes.wait, self._stalls, lambda: t.returned >= t.asked or not target.live,
                                     end, end + deadline_s)  # stalls extend it up to twice the deadline
        returned = t.returned
        missed = self._ledger.victims.close_eviction(t, judge=answered is False)
        killed = False
        if missed and kill_on_miss:
            peer = self._peers.get(target.session_id)
            killed = peer is not None and self._kill(peer, "missed a forced eviction")
            if killed:
                await self._changes.wait(lambda: not target.live, KILL_WAIT_S)
        log.info("forced eviction of session %s: %d of %d pages given back%s", session_id, returned, asked,
                 ", deadline missed" + (", killed" if killed else "") if missed else "")
        return EvictOutcome(asked, returned, missed, killed)
