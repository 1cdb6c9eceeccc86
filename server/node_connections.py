"""The node's side channel: accepting connections, and each one's life as a session.

Owns: accepting side-channel connections (identity by SO_PEERCRED, and under ``--principal-by
pod`` the cgroup of the process that connected, read once, principals.py; never stopped by an
accept error, side_channel.py Note [Accept errors]) within the operator's per-uid (per-pod)
limits (limits.py: over one, the client is told ``refused`` with LimitExceededError and the
connection closes); the hello, the session it opens, and its end; the tasks serving the
connections. Holds the ledger, the node's peers (node_peers.py) and the loop's stall watch
(loop_stalls.py, started with the accept loop).
Invariants: a session ends, and its pages go back to the page pool, as soon as its connection
closes or its process exits (EOF or pidfd readable), whichever comes first; every slot a
connection took is vacated once its connection is closed (what a caller leaves in the Closer
is bounded); a socket is never closed on the event loop (side_channel.py, Note [Closing off
the loop]); no error of one connection ends the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from vtalloc.allocator.errors import InvalidArgumentError

from .ledger import Ledger
from .limits import SESSIONS_BURST, SESSIONS_PER_S, RatePacer, RefusalLog, SessionLimits, UidSlots, who
from .loop_stalls import LoopStalls
from .node_peers import SEND_TIMEOUT_S, NodePeers, Peer
from .principals import PeerIdentity, PeerIdentityError, boot_ticks_now, limit_key, peer_cgroup
from .protocol.declared_quota import declared_from_hello
from .protocol.errors import LimitExceededError, PermissionDeniedError, echo
from .protocol.side_channel import PROTOCOL_VERSION, ProtocolError, version_of
from .records import SESSION_KINDS
from .side_channel import AcceptFailures, AsyncConnection, Closer, peer_credentials, peer_pidfd
from .state_file import process_start_ticks

__all__ = ["NodeConnections"]

log = logging.getLogger("vtalloc.server")

REFUSE_SEND_TIMEOUT_S = 0.1  # a refusal is one small datagram on a new connection: it fits at once;
                             # a refused new connection's hello is waited for this long


class NodeConnections:
    def __init__(self, ledger: Ledger, peers: NodePeers, stalls: LoopStalls, *, limits: SessionLimits | None = None,
                 principal_by: str = "uid") -> None:
        self._ledger = ledger
        self._peers = peers
        self._stalls = stalls
        self.principal_by = principal_by  # "uid" or "pod" (principals.py)
        self.limits = limits = limits or SessionLimits()
        self._pending = UidSlots("side-channel connections waiting for their hello", "--max-pending-per-uid",
                                 limits.max_pending_per_uid)
        self._sessions = UidSlots("open sessions", "--max-sessions-per-uid", limits.max_sessions_per_uid)
        self._refusals = RefusalLog()
        self._opens = RatePacer(SESSIONS_PER_S, SESSIONS_BURST, limits.hello_timeout_s)  # limits.py
        self._unidentified = UidSlots("connections whose cgroup could not be read", "--principal-by pod", 0)
        self.closer = Closer()   # sockets and descriptors closed off the loop (the gRPC front shares it)
        self._tasks: set[asyncio.Task] = set()

    async def serve_side_channel(self, listener: socket.socket) -> None:
        """Accept connections until cancelled; each becomes a session after its hello.

        No accept error ends the loop (Note [Accept errors])."""
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        failures = AcceptFailures()
        self._stalls.start()
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

    def identify(self, sock: socket.socket, pid: int, pidfd: int | None, exact: bool,
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
            self.closer.close(-1, [sock.detach()])  # never on the loop: side_channel.py, Note [Closing off the loop]
            return
        pidfd, exact = peer_pidfd(sock, pid)  # at once: the process that connected (principals.py)
        try:
            ident, unknown = self.identify(sock, pid, pidfd, exact, accepted_ticks), None
        except PeerIdentityError as e:
            ident, unknown = None, e
        except BaseException:
            if pidfd is not None:
                os.close(pidfd)
            self.closer.close(uid, [sock.detach()])
            raise
        key = limit_key(uid, ident.pod if ident else None)
        conn = AsyncConnection(sock, loop, self.closer, key)
        peer: Peer | None = None
        held: list[UidSlots] = []
        try:
            await self._take(self._pending, held, conn, pid, key)  # an unidentified peer's, too: its uid's
            wait = self._opens.delay(key)   # paced per uid before any work: limits.py, Note [Paced session opens]
            if wait is None:
                await self._refuse(conn, pid, key, self._pending, True, LimitExceededError(
                    f"{who(key)} opens sessions faster than {SESSIONS_PER_S:g} per second (after {SESSIONS_BURST}) "
                    "on this vtalloc daemon; try again shortly"), retry=True)
                return
            if wait:
                await asyncio.sleep(wait)
            if unknown is not None:
                await self._refuse(conn, pid, uid, self._unidentified, True, PermissionDeniedError(
                    f"the vtalloc daemon cannot tell which cgroup pid {pid} is in, so it cannot tell whose quota it "
                    f"would use (--principal-by pod): {unknown}"))
                return
            hello = await conn.recv(self.limits.hello_timeout_s)
            if hello.get("t") != "hello" or version_of(hello) != PROTOCOL_VERSION:
                raise ProtocolError(f"expected hello v{PROTOCOL_VERSION}, got {echo(hello.get('t'))} "
                                    f"v{echo(hello.get('v'))}")
            if self._peers.closing:
                return
            kind = hello.get("kind")
            if kind not in SESSION_KINDS:
                raise ProtocolError(f"unknown session kind {echo(kind)}")
            try:
                declared = declared_from_hello(hello)
            except InvalidArgumentError as e:
                self._ledger.books.count_protocol_error()
                await self._refuse(conn, pid, key, self._pending, False, e)
                return
            held.remove(self._pending)
            self._pending.vacate(key)
            await self._take(self._sessions, held, conn, pid, key)
            session = self._ledger.sessions.open(pid, uid, gid, kind, process_start_ticks(pid) or 0,
                                               cgroup=ident.cgroup if ident else "", pod=ident.pod if ident else None,
                                               declared=declared)
            peer = self._peers.add(Peer(session, conn, pidfd))
            info = self._ledger.views.session_info(session)
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
                if declared:  # tell the sessions it binds: its principal's, of its uid (ledger_quotas.py)
                    self._peers.quota_changed(self._ledger.quotas.for_session(session), uid)
            clean = await self._until_gone(peer)
            self._peers.end(peer, clean=clean)
        except LimitExceededError:
            pass  # refused and logged by _take
        except (ProtocolError, asyncio.TimeoutError, TimeoutError) as e:
            self._ledger.books.count_protocol_error()
            log.warning("side channel from pid %d uid %d dropped: %s", pid, uid, str(e) or type(e).__name__)
        except (EOFError, OSError):
            pass
        except Exception:  # noqa: BLE001 - a bug here ends this connection, never the daemon
            log.exception("side channel from pid %d uid %d failed unexpectedly; dropped", pid, uid)
        finally:
            if peer is not None:
                self._peers.end(peer, clean=False)
            if pidfd is not None and peer is None:
                os.close(pidfd)
            # The slots come back once the connection is closed: what a caller leaves in the Closer is bounded.
            def vacate() -> None:
                for slots in held:
                    slots.vacate(key)
            conn.close(then=vacate)

    async def _refuse(self, conn: AsyncConnection, pid: int, key: object, slots: UidSlots, hello_unread: bool,
                      e: Exception, retry: bool = False) -> None:
        """Log (rate-limited per caller and reason) and tell the client why (a ``refused`` message
        naming the error's class; ``retry``: the refusal is about this moment, not this session:
        the same hello may succeed shortly, and a client retries it within its timeout); the
        caller then closes the connection."""
        self._refusals.refused(key, pid, slots, str(e),
                               who=None if isinstance(key, int) else f"side channel from pid {pid} {who(key)}")
        try:
            await conn.send({"t": "refused", "v": PROTOCOL_VERSION, "error": type(e).__name__,
                             "message": str(e), "retry": retry}, timeout_s=REFUSE_SEND_TIMEOUT_S)
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
            # A pending slot comes back within the hello timeout (a hello read, or a silent peer
            # dropped): a burst of one uid's opens under load is retried, not failed.
            await self._refuse(conn, pid, key, slots, slots is self._pending, e, retry=slots is self._pending)
            raise
        held.append(slots)

    async def _until_gone(self, peer: Peer) -> bool:
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

    async def close(self) -> None:
        """Cancel the connections' tasks and wait for their ends (the node is stopping)."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
