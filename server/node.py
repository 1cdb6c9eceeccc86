"""The node: the daemon's page pool, its sessions' connections, and the pressure protocol.

Owns the I/O around the ledger, on the event loop: accepting side-channel connections
(identity by SO_PEERCRED, and under ``--principal-by pod`` the cgroup of the process that
connected, read once, principals.py; never stopped by an accept error, side_channel.py Note [Accept
errors]) within the operator's per-uid (per-pod) limits (limits.py: over one, the client is told
``refused`` with LimitExceededError and the connection closes), creating pages and pushing their descriptors, releasing pages
that come back or whose session ended, asking sessions to evict when the node runs short,
and the decision when one does not answer in time (Note [Missed eviction deadline]).

Why this file is long: a connection's lifetime, a lease's delivery and the pressure protocol
share the peers and the wake-up future; split, each would reach into the others' state.

Invariants: a page is in the page pool exactly while the ledger has an owner for it (pages are
created after the ledger admits a lease and released as soon as the ledger lets go of them, or
at once when creating, recording or delivering a lease fails in any way);
a session ends, and its pages go back to the page pool, as soon as its connection closes or its
process exits (EOF or pidfd readable), whichever comes first. Returned pages are released,
never handed to another session, so no bytes cross between sessions (memfd pages start
zeroed; see docs/service.md on cuda pages).

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
import socket
from typing import AsyncIterator, Callable

from vtalloc.allocator.errors import InvalidArgumentError, OutOfMemoryError
from vtalloc.allocator.pool import PagePool

from .ledger import Ledger
from .limits import RefusalLog, SessionLimits, UidSlots, who
from .loop_stalls import LoopStalls, wait_judged
from .node_events import EvictEvent, EvictOutcome, QuotaEvent, ShutdownEvent
from .principals import PeerIdentity, PeerIdentityError, boot_ticks_now, limit_key, peer_cgroup
from .protocol.declared_quota import declared_from_hello
from .protocol.errors import (FailedPreconditionError, LimitExceededError, NodeShortError, PermissionDeniedError,
                              ServiceUnavailableError, echo)
from .protocol.side_channel import MAX_FDS_PER_MESSAGE, PROTOCOL_VERSION, ProtocolError, version_of
from .quota import Quota
from .records import SESSION_KINDS, EvictTicket, Session
from .side_channel import AcceptFailures, AsyncConnection, Closer, peer_credentials, peer_pidfd
from .state_file import process_start_ticks

__all__ = ["Node", "EvictEvent", "QuotaEvent", "ShutdownEvent", "EvictOutcome"]

log = logging.getLogger("vtalloc.server")

SEND_TIMEOUT_S = 5.0
REFUSE_SEND_TIMEOUT_S = 0.1  # a refusal is one small datagram on a new connection: it fits at once;
                             # a refused new connection's hello is waited for this long
KILL_WAIT_S = 2.0
REPLY_MARGIN_S = 0.2  # a lease stops waiting this long before its RPC's deadline, to answer in time
class _Peer:
    """One session's connection, pidfd and event queue."""

    def __init__(self, session: Session, conn: AsyncConnection, pidfd: int | None) -> None:
        self.session = session
        self.conn = conn
        self.pidfd = pidfd
        self.events: asyncio.Queue[object] = asyncio.Queue()
        self.watching = False


class Node:
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
        self._unidentified = UidSlots("connections whose cgroup could not be read", "--principal-by pod", 0)
        self._closer = Closer()
        self.stalls = LoopStalls()
        self._peers: dict[str, _Peer] = {}
        self._wake: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
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

    # -- connections ------------------------------------------------------------------------
    async def serve_side_channel(self, listener: socket.socket) -> None:
        """Accept connections until cancelled; each becomes a session after its hello.

        No accept error ends the loop (Note [Accept errors])."""
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        failures = AcceptFailures()
        self.stalls.start()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as e:
                await asyncio.sleep(failures.failed(e))
                continue
            failures.succeeded()
            task = loop.create_task(self._session_lifetime(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _identify(self, sock: socket.socket, pid: int, pidfd: int | None, exact: bool,
                  accepted_ticks: int) -> PeerIdentity | None:
        """The peer's cgroup and pod under ``--principal-by pod`` (None in uid mode); raises
        PeerIdentityError when it cannot be read safely (principals.py, Note [Reading a peer's cgroup])."""
        if self.principal_by != "pod":
            return None
        start = None if exact else process_start_ticks(pid)
        return peer_cgroup(pid, pidfd, exact_pidfd=exact, accepted_ticks=accepted_ticks, start_ticks=start)

    async def _session_lifetime(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        accepted_ticks = boot_ticks_now()
        try:
            pid, uid, gid = peer_credentials(sock)
        except OSError:
            self._closer.close(-1, [sock.detach()])  # never on the loop: side_channel.py, Note [Closing off the loop]
            return
        pidfd, exact = peer_pidfd(sock, pid)  # at once: the process that connected (principals.py)
        try:
            ident, unknown = self._identify(sock, pid, pidfd, exact, accepted_ticks), None
        except PeerIdentityError as e:
            ident, unknown = None, e
        except BaseException:
            if pidfd is not None:
                os.close(pidfd)
            self._closer.close(uid, [sock.detach()])
            raise
        key = limit_key(uid, ident.pod if ident else None)
        conn = AsyncConnection(sock, loop, self._closer, key)
        peer: _Peer | None = None
        held: list[UidSlots] = []
        try:
            await self._take(self._pending, held, conn, pid, key)  # an unidentified peer's, too: its uid's
            if unknown is not None:
                await self._refuse(conn, pid, uid, self._unidentified, True, PermissionDeniedError(
                    f"the vtalloc daemon cannot tell which cgroup pid {pid} is in, so it cannot tell whose quota it "
                    f"would use (--principal-by pod): {unknown}"))
                return
            hello = await conn.recv(self.limits.hello_timeout_s)
            if hello.get("t") != "hello" or version_of(hello) != PROTOCOL_VERSION:
                raise ProtocolError(f"expected hello v{PROTOCOL_VERSION}, got {echo(hello.get('t'))} "
                                    f"v{echo(hello.get('v'))}")
            if self._closing:
                return
            kind = hello.get("kind")
            if kind not in SESSION_KINDS:
                raise ProtocolError(f"unknown session kind {echo(kind)}")
            try:
                declared = declared_from_hello(hello)
            except InvalidArgumentError as e:
                self.ledger.count_protocol_error()
                await self._refuse(conn, pid, key, self._pending, False, e)
                return
            held.remove(self._pending)
            self._pending.give_back(key)
            await self._take(self._sessions, held, conn, pid, key)
            session = self.ledger.open_session(pid, uid, gid, kind, process_start_ticks(pid) or 0,
                                               cgroup=ident.cgroup if ident else "", pod=ident.pod if ident else None,
                                               declared=declared)
            peer = self._peers[session.session_id] = _Peer(session, conn, pidfd)
            info = self.ledger.session_info(session)
            await conn.send({"t": "session", "v": PROTOCOL_VERSION, "token": session.token,
                             "session_id": session.session_id, "pid": pid, "uid": uid,
                             "principal": session.principal, "page_bytes": info.page_bytes,
                             "backend": info.backend, "device": info.device,
                             "capacity_bytes": info.capacity_bytes,
                             "host_capacity_bytes": info.host_capacity_bytes,
                             "evict_deadline_s": info.evict_deadline_s}, timeout_s=SEND_TIMEOUT_S)
            if kind == "client":
                log.info("session %s opened: pid %d uid %d (%s)%s", session.session_id, pid, uid, session.principal,
                         f", quota {info.quota.min_bytes}:{info.quota.max_bytes} after its declaration"
                         if declared else "")
                if declared:
                    self.quota_changed(self.ledger.quota_of(session.principal))
            clean = await self._until_gone(peer)
            self._end(peer, clean=clean)
        except LimitExceededError:
            pass  # refused and logged by _take
        except (ProtocolError, asyncio.TimeoutError, TimeoutError) as e:
            self.ledger.count_protocol_error()
            log.warning("side channel from pid %d uid %d dropped: %s", pid, uid, str(e) or type(e).__name__)
        except (EOFError, OSError):
            pass
        except Exception:  # noqa: BLE001 - a bug here ends this connection, never the daemon
            log.exception("side channel from pid %d uid %d failed unexpectedly; dropped", pid, uid)
        finally:
            if peer is not None:
                self._end(peer, clean=False)
            if pidfd is not None and peer is None:
                os.close(pidfd)
            # The slots come back once the connection is closed: what a caller leaves in the Closer is bounded.
            def give_back() -> None:
                for slots in held:
                    slots.give_back(key)
            conn.close(then=give_back)

    async def _refuse(self, conn: AsyncConnection, pid: int, key: object, slots: UidSlots, hello_unread: bool,
                      e: Exception) -> None:
        """Log (rate-limited per caller and reason) and tell the client why (a ``refused`` message
        naming the error's class); the caller then closes the connection."""
        self._refusals.refused(key, pid, slots, str(e),
                               who=None if isinstance(key, int) else f"side channel from pid {pid} {who(key)}")
        try:
            await conn.send({"t": "refused", "v": PROTOCOL_VERSION, "error": type(e).__name__,
                             "message": str(e)}, timeout_s=REFUSE_SEND_TIMEOUT_S)
            if hello_unread:
                # Read the hello it may be sending: closing with it unread would reset
                # the connection, and the client would see ECONNRESET, not the reason.
                await conn.recv(REFUSE_SEND_TIMEOUT_S)
        except (OSError, EOFError, TimeoutError, asyncio.TimeoutError, ProtocolError):
            pass  # the client is gone, not reading or not saying hello: it sees the connection close

    async def _take(self, slots: UidSlots, held: list[UidSlots], conn: AsyncConnection, pid: int,
                    key: object) -> None:
        """A slot of ``slots`` for ``key`` (a uid, or a pod: principals.limit_key; added to ``held``),
        or: log, tell the client why (a ``refused`` message naming LimitExceededError) and raise
        LimitExceededError."""
        try:
            slots.take(key)
        except LimitExceededError as e:
            await self._refuse(conn, pid, key, slots, slots is self._pending, e)
            raise
        held.append(slots)

    async def _until_gone(self, peer: _Peer) -> bool:
        """Wait for the end of the session: True for a goodbye, False for EOF or process exit."""
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        if peer.pidfd is not None:
            def on_exit() -> None:
                if not exited.done():
                    exited.set_result(None)
            loop.add_reader(peer.pidfd, on_exit)
        reader = asyncio.ensure_future(peer.conn.recv(None))
        try:
            done, _ = await asyncio.wait({reader, exited}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                msg = reader.result()  # EOFError / ProtocolError propagate
                if msg.get("t") == "bye":
                    return True
                raise ProtocolError(f"unexpected side-channel message {echo(msg.get('t'))} after hello")
            return False
        finally:
            if peer.pidfd is not None:
                loop.remove_reader(peer.pidfd)
            reader.cancel()
            exited.cancel()
            try:
                await reader
            except BaseException:  # noqa: BLE001 - the reader's own end does not matter any more
                pass

    def _end(self, peer: _Peer, *, clean: bool) -> None:
        s = peer.session
        if self._peers.get(s.session_id) is not peer:
            return
        del self._peers[s.session_id]
        pages = self.ledger.end_session(s, clean=clean)
        self._release(pages)
        peer.events.put_nowait(None)
        peer.conn.close()
        if peer.pidfd is not None:
            os.close(peer.pidfd)
            peer.pidfd = None
        if s.kind == "client":
            how = "closed" if clean else "gone (reclaimed)"
            log.info("session %s %s: %d pages back to the page pool", s.session_id, how, len(pages))

    def _release(self, pages: list[int]) -> None:
        for p in pages:
            try:
                self.pool.release_page(p)
            except Exception:  # noqa: BLE001 - a page the page pool cannot release is logged, not fatal
                log.exception("could not release page %d", p)
        self._changed()

    # -- leases -----------------------------------------------------------------------------
    async def lease(self, s: Session, pages: int, time_left_s: float | None) -> tuple[int, list[int]]:
        loop = asyncio.get_running_loop()
        budget = self.ledger.geometry.evict_deadline_s + KILL_WAIT_S
        if time_left_s is not None:
            budget = min(budget, max(0.0, time_left_s - REPLY_MARGIN_S))
        deadline = loop.time() + budget
        asked = False
        while True:
            short = self.ledger.admit(s, pages)
            if not short:
                break
            if asked or loop.time() >= deadline:
                self.ledger.count_node_short()
                log.warning("lease of %d pages for session %s (%s, pid %d) refused: the node is %d pages short",
                            pages, s.session_id, s.principal, s.pid, short)
                raise NodeShortError(
                    f"the node is {short} pages short and other sessions did not free enough in time",
                    requested_bytes=pages * self.ledger.geometry.page_bytes,
                    capacity_bytes=self.ledger.geometry.capacity_bytes)
            await self._relieve(s, pages, short, deadline)
            asked = True
        peer = self._peers.get(s.session_id)
        if peer is None:
            raise ServiceUnavailableError("the session ended")
        return await self._deliver(peer, pages)

    async def _deliver(self, peer: _Peer, pages: int) -> tuple[int, list[int]]:
        s = peer.session
        created: list[int] = []
        try:
            for _ in range(pages):
                created.append(self.pool.create_page())
            self.ledger.add_pages(s, created)
        except BaseException as e:
            # Any failure, not only out-of-memory (a driver error, a cancellation): the pages
            # created so far are on no session's books, so they go back to the page pool now;
            # kept, the ledger would count them free while the pool holds them (the daemon then
            # never leased again).
            self._release(created)
            if isinstance(e, OutOfMemoryError):
                self.ledger.count_node_short()
            raise
        self.on_holdings_changed()  # recorded before delivery: a crash from here on never under-counts
        lease_id = self.ledger.new_lease_id()
        try:
            for i in range(0, len(created), MAX_FDS_PER_MESSAGE):
                batch = created[i:i + MAX_FDS_PER_MESSAGE]
                fds: list[int] = []
                try:
                    for p in batch:
                        fds.append(self.pool.export_page(p))
                    await peer.conn.send({"t": "pages", "lease_id": lease_id, "page_ids": batch}, fds,
                                         timeout_s=SEND_TIMEOUT_S)
                finally:
                    for fd in fds:
                        os.close(fd)
        except BaseException as e:
            # Not delivered (client gone, not reading, or cancelled): descriptors already sent
            # are closed with the client's socket; the pages come back here at once.
            self.ledger.drop_pages(s, created)
            self._release(created)
            if isinstance(e, (OSError, EOFError, TimeoutError)):
                raise ServiceUnavailableError(f"could not deliver pages to session {s.session_id}: {e}") from None
            raise
        self.ledger.mark_delivered(s, created)
        return lease_id, created

    def give_back(self, s: Session, page_ids: list[int], evict_request_id: int) -> int:
        ids = self.ledger.take_back(s, page_ids, evict_request_id)
        self._release(ids)
        return len(ids)

    # -- pressure ---------------------------------------------------------------------------
    async def _relieve(self, requester: Session, pages: int, short: int, deadline: float) -> None:
        """Ask others for ``short`` pages by the eviction deadline (the configured one, or less
        when the lease's ``deadline`` is nearer); judge them then, enforce on a miss, and wait
        for killed sessions' pages until ``deadline``."""
        loop = asyncio.get_running_loop()
        victims = self.ledger.pick_victims(short, requester)
        if sum(k for _, k in victims) < short:
            return  # nobody can give enough back: the caller fails at once
        evict_by = min(deadline, loop.time() + self.ledger.geometry.evict_deadline_s)
        log.info("the node is %d pages short for %s: asking %s", short, requester.principal,
                 ", ".join(f"session {v.session_id} for {k}" for v, k in victims))
        asked = [self._ask(v, k, evict_by - loop.time()) for v, k in victims]
        tickets = [t for t in asked if t is not None]

        def enough() -> bool:
            return self.ledger.free_pages() >= pages

        answered = await wait_judged(self._wait, self.stalls, enough, evict_by, deadline)
        if answered is not False:
            for t in tickets:
                self.ledger.close_eviction(t, judge=False)
            if answered is None:
                log.warning("the daemon's event loop stalled during an eviction request; nobody is judged late, "
                            "and the lease of %d pages for %s fails", pages, requester.principal)
            return
        missed = [t for t in tickets if self.ledger.close_eviction(t, judge=True)]
        if not missed:
            return
        if not (self.kill_on_missed_deadline and self.ledger.within_guarantee(requester, pages)):
            log.warning("%d session(s) missed an eviction deadline; lease of %d pages for %s fails",
                        len(missed), pages, requester.principal)
            return
        for t in missed:
            peer = self._peers.get(t.session_id)
            if peer is not None:
                self._kill(peer, f"missed an eviction deadline while {requester.principal} needed its guarantee")
        await self._wait(enough, max(deadline - loop.time(), 0.0))

    def _ask(self, victim: Session, pages: int, deadline_s: float) -> EvictTicket | None:
        peer = self._peers.get(victim.session_id)
        if peer is None:
            return None
        t = self.ledger.open_eviction(victim, pages)
        peer.events.put_nowait(EvictEvent(t.request_id, pages, max(0.0, deadline_s)))
        return t

    def _kill(self, peer: _Peer, why: str) -> bool:
        s = peer.session
        try:
            if peer.pidfd is not None:
                signal.pidfd_send_signal(peer.pidfd, signal.SIGKILL)
            else:
                os.kill(s.pid, signal.SIGKILL)
        except OSError as e:
            log.error("could not kill pid %d of session %s (%s): %s", s.pid, s.session_id, why, e)
            return False
        self.ledger.count_kill()
        log.warning("killed pid %d of session %s: %s", s.pid, s.session_id, why)
        return True

    async def evict_session(self, admin: Session, session_id: str, pages: int, kill_on_miss: bool) -> EvictOutcome:
        self.ledger.require_admin(admin, "forced eviction")
        target = self.ledger.session_for(admin, session_id)
        if target.kind != "client":
            raise FailedPreconditionError("an observer session holds no pages")
        held = len(target.pages)
        asked = pages if pages else min(held, self.ledger.excess_pages(target.principal))
        if asked > held:
            raise InvalidArgumentError(f"session {session_id} holds {held} pages; cannot evict {asked}")
        if asked == 0:
            return EvictOutcome(0, 0, False, False)
        loop = asyncio.get_running_loop()
        deadline_s = self.ledger.geometry.evict_deadline_s
        log.info("forced eviction by uid %d: session %s (%s, pid %d) asked for %d of its %d pages within %.1f s%s",
                 admin.uid, session_id, target.principal, target.pid, asked, held, deadline_s,
                 ", or killed" if kill_on_miss else "")
        t = self._ask(target, asked, deadline_s)
        if t is None:
            raise FailedPreconditionError(f"session {session_id} has ended")
        end = loop.time() + deadline_s
        answered = await wait_judged(self._wait, self.stalls, lambda: t.returned >= t.asked or not target.live,
                                     end, end + deadline_s)  # stalls extend it up to twice the deadline
        returned = t.returned
        missed = self.ledger.close_eviction(t, judge=answered is False)
        killed = False
        if missed and kill_on_miss:
            peer = self._peers.get(target.session_id)
            killed = peer is not None and self._kill(peer, "missed a forced eviction")
            if killed:
                await self._wait(lambda: not target.live, KILL_WAIT_S)
        log.info("forced eviction of session %s: %d of %d pages given back%s", session_id, returned, asked,
                 ", deadline missed" + (", killed" if killed else "") if missed else "")
        return EvictOutcome(asked, returned, missed, killed)

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

    def quota_changed(self, quota: Quota) -> None:
        """Tell the principal's client sessions their quota: the one in force, lowered by declarations."""
        quota = self.ledger.quota_of(quota.principal)
        for peer in list(self._peers.values()):
            if peer.session.principal == quota.principal and peer.session.kind == "client":
                peer.events.put_nowait(QuotaEvent(quota))

    # -- shutdown ---------------------------------------------------------------------------
    def announce_shutdown(self, reason: str) -> None:
        self._closing = True
        for peer in self._peers.values():
            peer.events.put_nowait(ShutdownEvent(reason))

    async def close(self) -> None:
        """End every session (their mapped pages stay valid in the clients) and the page pool."""
        self._closing = True
        self.stalls.stop()
        for peer in list(self._peers.values()):
            self._end(peer, clean=True)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.pool.close()
