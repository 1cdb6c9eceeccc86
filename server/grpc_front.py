"""The gRPC socket's front door: the daemon accepts every gRPC connection itself and forwards it.

Owns: the public gRPC socket's accept loop (identity by SO_PEERCRED, under ``--principal-by
pod`` the pod, read as the side channel reads it), the per-caller bound on connections
(:func:`connections_per_uid`), closing connections of callers without a live session after
SESSION_LESS_TIMEOUT_S, and the byte pump between each connection and the gRPC server, which
listens on a private socket only the daemon's uid can reach (Note [The front door]).
Invariants: a connection takes its caller's slot before any other work (no upstream
connection, no read) and gives it back only once it is closed; every receive has room for
SCM_MAX_FD descriptors, and any descriptor received goes to the Closer with its connection,
which ends (a gRPC client sends none): no descriptor a peer sent and no connection is closed
on a thread that serves anyone else (side_channel.py, Note [Closing off the loop]); what
waits in a pump is bounded (PUMP_HIGH_WATER bytes a direction: past it the sender is not
read until the receiver drains it). Runs on its own thread and event loop, so a flood of
connections or bytes never stalls the loop that serves leases.

Note [The front door]
---------------------
gRPC's server accepts and reads its sockets in its own threads, where the daemon can neither
count connections per uid nor see descriptors: one uid opened 2048 connections (HTTP/2
preface and settings, then silence; nothing closed them) and the daemon ran out of
descriptors; 60 TCP sockets with SO_LINGER 25 s sent as SCM_RIGHTS on the gRPC socket were
dropped, and so closed, by gRPC's reading thread, which stalled every user's calls for 20 s.
So the gRPC server listens on ``<private dir>/g.sock`` (a 0700 directory the daemon makes) and
the public socket is the daemon's: each accepted connection (1) is counted against its
caller at once, over the bound it is closed unread; (2) is read with ``recvmsg`` and room for
SCM_MAX_FD descriptors (a stream socket gives the descriptors of one message per receive, at
most 253), so the kernel never drops one here; descriptors end the connection and go to the
Closer with it; (3) is connected upstream only when its first bytes arrive (the client's own
rendezvous check opens and closes one without a byte); (4) is closed when its caller has had
no live session (client or observer) for SESSION_LESS_TIMEOUT_S: calls that need no session
(health checks, reflection) are short; an idle connection of a caller with sessions stays,
within the bound.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Callable

from .limits import RefusalLog, UidSlots, who
from .protocol.errors import LimitExceededError
from .protocol.side_channel import recv_datagram
from .side_channel import SCM_MAX_FD, AcceptFailures, Closer, peer_credentials

Key = int | str   # a caller: its uid, or its pod (principals.limit_key)

__all__ = ["GrpcFront", "connections_per_uid", "SESSION_LESS_TIMEOUT_S", "PUMP_HIGH_WATER", "SWEEP_EVERY_S"]

log = logging.getLogger("vtalloc.server")

SESSION_LESS_TIMEOUT_S = 10.0   # a caller with no live session keeps a connection this long
SWEEP_EVERY_S = 1.0
PUMP_HIGH_WATER = 1 << 20       # bytes waiting in one direction before its sender is no longer read
_CHUNK = 1 << 16


def connections_per_uid(max_sessions_per_uid: int) -> int:
    """The gRPC connections one caller may hold: one per session (its channel), as many again
    for tools and reconnects, and a few for the sessions' own rendezvous checks."""
    return 2 * max_sessions_per_uid + 16


class _Pipe:
    """One accepted connection and its upstream connection to the gRPC server, on the front's loop."""

    def __init__(self, front: "GrpcFront", sock: socket.socket, key: Key, pid: int) -> None:
        self.front, self.sock, self.key, self.pid = front, sock, key, pid
        self.loop = front.loop
        self.upstream: socket.socket | None = None
        self.connecting = False
        self.to_up = bytearray()
        self.to_client = bytearray()
        self.opened = time.monotonic()
        self.closed = False
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._from_client)

    # client -> gRPC ----------------------------------------------------------------------------
    def _from_client(self) -> None:
        try:
            data, fds, flags = recv_datagram(self.sock, SCM_MAX_FD, _CHUNK)   # the one receive path
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if fds or flags & socket.MSG_CTRUNC:
            self.front.closer.close(self.key, fds)     # never here: side_channel.py, Note [Closing off the loop]
            self.front.refusals.refused(self.key, self.pid, self.front.slots,
                                        f"{len(fds)} descriptor(s) sent on the gRPC socket; connection closed",
                                        who=f"gRPC connection from pid {self.pid} {who(self.key)}")
            self.front.descriptors_refused += len(fds)
            self.close()
            return
        if not data:
            self.close()
            return
        if self.upstream is None and not self.connecting:
            self.connecting = True
            self.loop.create_task(self._connect())
        self._queue(self.to_up, data, self.upstream, self.sock)

    async def _connect(self) -> None:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        up.setblocking(False)
        try:
            await self.loop.sock_connect(up, self.front.upstream_path)
        except OSError as e:
            up.close()
            log.warning("gRPC front: cannot reach the gRPC server: %s", e)
            self.close()
            return
        if self.closed:
            up.close()
            return
        self.upstream = up
        self.loop.add_reader(up.fileno(), self._from_upstream)
        self._flush(self.to_up, up, self.sock)

    # gRPC -> client ----------------------------------------------------------------------------
    def _from_upstream(self) -> None:
        assert self.upstream is not None
        try:
            data = self.upstream.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self._queue(self.to_client, data, self.sock, self.upstream)

    # both ----------------------------------------------------------------------------------
    def _queue(self, buf: bytearray, data: bytes, dest: socket.socket | None, source: socket.socket) -> None:
        if not buf and dest is not None:
            try:
                sent = dest.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return
            data = data[sent:]
        if data:
            buf += data
            if dest is not None:
                self.loop.add_writer(dest.fileno(), self._flush, buf, dest, source)
            if len(buf) > PUMP_HIGH_WATER:      # bounded: stop reading the sender until it drains
                self.loop.remove_reader(source.fileno())

    def _flush(self, buf: bytearray, dest: socket.socket, source: socket.socket) -> None:
        if self.closed:
            return
        while buf:
            try:
                sent = dest.send(buf[:_CHUNK])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                return
            del buf[:sent]
        if buf:
            self.loop.add_writer(dest.fileno(), self._flush, buf, dest, source)
            return
        self.loop.remove_writer(dest.fileno())
        reader = self._from_client if source is self.sock else self._from_upstream
        self.loop.add_reader(source.fileno(), reader)

    def close(self) -> None:
        """Stop pumping; the sockets go to the Closer (the client's may hold unread descriptors),
        and the caller's slot comes back once they are closed."""
        if self.closed:
            return
        self.closed = True
        self.front.pipes.discard(self)
        fds = []
        for s in (self.sock, self.upstream):
            if s is not None and s.fileno() >= 0:
                self.loop.remove_reader(s.fileno())
                self.loop.remove_writer(s.fileno())
                fds.append(s.detach())
        key, slots = self.key, self.front.slots
        self.front.closer.close(key, fds, lambda: slots.vacate(key))


class GrpcFront:
    """The public gRPC socket, served on a thread of its own (Note [The front door])."""

    def __init__(self, listener: socket.socket, upstream_path: str, *, per_uid: int, closer: Closer,
                 identify: Callable[[socket.socket, int, int], Key],
                 session_keys: Callable[[], set[int | str]],
                 session_less_timeout_s: float = SESSION_LESS_TIMEOUT_S) -> None:
        self.listener = listener
        self.upstream_path = upstream_path
        self.closer = closer
        self.identify = identify            # (socket, pid, uid) -> limit key; raises PermissionError to refuse
        self.session_keys = session_keys    # the limit keys of every caller with a live session (ledger)
        self.session_less_timeout_s = session_less_timeout_s
        self.slots = UidSlots("gRPC connections", "2 x --max-sessions-per-uid + 16", per_uid)
        self.refusals = RefusalLog()
        self.pipes: set[_Pipe] = set()
        self.descriptors_refused = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="vtalloc-grpc-front", daemon=True)
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._started.wait()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close every connection and the listener's loop (the listener itself is the caller's)."""
        if self._thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        self.listener.setblocking(False)
        accept = self.loop.create_task(self._accept_loop())
        sweep = self.loop.create_task(self._sweep_loop())
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            for task in (accept, sweep):
                task.cancel()
            await asyncio.gather(accept, sweep, return_exceptions=True)
            for pipe in list(self.pipes):
                pipe.close()

    async def _accept_loop(self) -> None:
        failures = AcceptFailures(what="gRPC socket")
        while True:
            try:
                sock, _ = await self.loop.sock_accept(self.listener)
            except OSError as e:
                await asyncio.sleep(failures.failed(e))
                continue
            failures.succeeded()
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        """Count the connection against its caller first; over the bound (or unidentifiable) it is closed unread."""
        try:
            pid, uid, _ = peer_credentials(sock)
            key = self.identify(sock, pid, uid)
        except OSError as e:
            self.closer.close(-1, [sock.detach()])
            log.debug("gRPC connection refused: %s", e)
            return
        try:
            self.slots.take(key)
        except LimitExceededError as e:
            self.refusals.refused(key, pid, self.slots, str(e), who=f"gRPC connection from pid {pid} {who(key)}")
            self.closer.close(key, [sock.detach()])
            return
        self.pipes.add(_Pipe(self, sock, key, pid))

    async def _sweep_loop(self) -> None:
        """Close connections of callers that have had no live session for the timeout."""
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> int:
        keys = self.session_keys()
        stale = [p for p in self.pipes if p.key not in keys and now - p.opened > self.session_less_timeout_s]
        for pipe in stale:
            pipe.close()
        if stale:
            log.info("gRPC front: closed %d connection(s) of callers without a session after %g s", len(stale),
                     self.session_less_timeout_s)
        return len(stale)
