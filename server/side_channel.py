"""The daemon's end of the side channel: peer identity and one connection on the event loop.

Owns: the socket calls only the daemon makes: peer identity (``SO_PEERCRED`` through
protocol/rendezvous.py, which clients use too, and a pidfd from ``SO_PEERPIDFD`` or
``pidfd_open``), :class:`AsyncConnection` (non-blocking receive and bounded send on the event
loop) and :class:`Closer`, which closes what a peer could have put descriptors into, off the
event loop (Note [Closing off the loop]). The wire format both ends speak is in
vtalloc.server.protocol.side_channel. A connection *is* a session: the daemon ends the
session (and takes its pages back) when the connection closes or the peer process exits.
:class:`AcceptFailures` paces and logs a failing ``accept`` (Note [Accept errors]).
Invariant: every descriptor received is either handed to the caller or closed here (a
client may send none: any it sends end the connection); no descriptor a peer sent, and no
connection socket (its unread datagrams may hold some), is closed on the event loop.

Note [Closing off the loop]
---------------------------
A peer can send any descriptor: a TCP socket with ``SO_LINGER`` and unsent data blocks the
``close`` that drops the last reference for the linger time, other kinds (FIFOs, devices)
may block or have side effects. The kernel drops the last reference in the thread that
closes, which is also the thread that calls ``recvmsg`` when a datagram's descriptors do not
fit its buffer (they are dropped, MSG_CTRUNC), and the thread that closes a connection whose
unread datagrams carry descriptors. So the daemon (1) receives with room for SCM_MAX_FD
descriptors, the most one datagram can carry, so the kernel never drops any in its thread;
(2) hands every received descriptor, and every connection socket, to :class:`Closer`,
never ``fstat``-ing, reading or otherwise touching them; (3) the Closer closes them on
worker threads, one uid's in order (a uid's lingering descriptor delays its own later
closes, nobody else's) and round robin between uids, on at most CLOSER_THREADS threads;
(4) the caller's slots (pending connection, session: limits.py) come back only once its
connection is closed, so what one uid can keep in the Closer is bounded by its own limits.

Note [Accept errors]
--------------------
``accept`` fails when the daemon is out of descriptors (EMFILE, ENFILE), the kernel out of
memory (ENOBUFS, ENOMEM) or a client gave up first (ECONNABORTED, EPROTO). None of these is
the listener's fault, so none ends the accept loop: it waits (from ACCEPT_BACKOFF_S,
doubling to ACCEPT_BACKOFF_MAX_S while accept keeps failing, since a listener with a
waiting connection stays readable and would spin) and tries again; once descriptors are
free, sessions open again. Meanwhile connections wait in the listen queue. The first
failure of a run is logged, then at most one line per ACCEPT_LOG_EVERY_S, and the recovery.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
import threading
import time
from collections import deque
from typing import Any, Callable, Sequence

from .protocol.rendezvous import peer_credentials
from .protocol.side_channel import FD_BYTES, ProtocolError, encode, parse_datagram, recv_datagram, send_datagram

__all__ = ["peer_credentials", "peer_pidfd", "AsyncConnection", "AcceptFailures", "Closer", "CLOSER_THREADS",
           "SCM_MAX_FD"]

log = logging.getLogger("vtalloc.server")

ACCEPT_BACKOFF_S = 0.02
ACCEPT_BACKOFF_MAX_S = 0.5
ACCEPT_LOG_EVERY_S = 10.0

CLOSER_THREADS = 16

_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5; older Pythons lack the name
# A client may send no descriptors, but the receive buffer has room for the most one datagram
# can carry (the kernel's SCM_MAX_FD): descriptors that do not fit would be dropped by the
# kernel in the receiving thread, the event loop's (Note [Closing off the loop]).
SCM_MAX_FD = 253


def peer_pidfd(sock: socket.socket, pid: int) -> tuple[int | None, bool]:
    """A pidfd for the peer, and whether it is exactly the process that connected: race-free
    ``SO_PEERPIDFD`` where the kernel has it (True), else ``pidfd_open(pid)`` (False: the pid may
    have been reused since; principals.py checks the start time where that matters)."""
    try:
        return struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD, FD_BYTES))[0], True
    except OSError:
        pass
    if pid <= 0:
        return None, False
    try:
        return os.pidfd_open(pid), False
    except (OSError, AttributeError):
        return None, False


class AsyncConnection:
    """The daemon's end of one side-channel connection, on the event loop (non-blocking)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, closer: "Closer", uid: int | str) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._loop = loop
        self._closer = closer
        self._uid = uid
        self.closed = False

    async def recv(self, timeout_s: float | None) -> dict[str, Any]:
        """The next message from the client; it may send no descriptors (ProtocolError if it does)."""
        fut: asyncio.Future[tuple[bytes, list[int], int]] = self._loop.create_future()
        fd = self.sock.fileno()

        def readable() -> None:
            if fut.done():
                return
            try:
                received = recv_datagram(self.sock, SCM_MAX_FD)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                fut.set_exception(EOFError(f"side channel: {e}"))
                return
            if fut.done():  # cancelled meanwhile: nobody will take what came
                self._closer.close(self._uid, received[1])
                return
            fut.set_result(received)

        self._loop.add_reader(fd, readable)
        try:
            data, fds, flags = await asyncio.wait_for(fut, timeout_s)
        except BaseException as e:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._closer.close(self._uid, fut.result()[1])  # received, then the wait was cancelled
            if isinstance(e, asyncio.TimeoutError):
                raise TimeoutError(f"nothing received within {timeout_s:g} s") from None
            raise
        finally:
            if not self.closed:
                self._loop.remove_reader(fd)
        if fds:  # never closed here: Note [Closing off the loop]
            self._closer.close(self._uid, fds)
            raise ProtocolError(f"{len(fds)} descriptor(s) sent to the daemon, which accepts none")
        msg, _ = parse_datagram(data, [], flags, 0)
        return msg

    async def send(self, message: dict[str, Any], fds: Sequence[int] = (), *, timeout_s: float) -> None:
        """Send one message, waiting (bounded) while the client's receive buffer is full."""
        data = encode(message)
        deadline = self._loop.time() + timeout_s
        while True:
            if self.closed:
                raise EOFError("the side channel is closed")
            try:
                send_datagram(self.sock, data, fds)
                return
            except (BlockingIOError, InterruptedError):
                pass
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise TimeoutError("the client does not read its side channel")
            fut: asyncio.Future[None] = self._loop.create_future()

            def wake(f: asyncio.Future[None] = fut) -> None:
                if not f.done():
                    f.set_result(None)
            fd = self.sock.fileno()
            self._loop.add_writer(fd, wake)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                if not self.closed:
                    self._loop.remove_writer(fd)

    def close(self, then: Callable[[], None] | None = None) -> None:
        """Close the connection off the loop (its unread datagrams may carry descriptors);
        ``then()`` runs on the loop once it, and everything its uid gave the Closer before, is closed."""
        fds: list[int] = []
        if not self.closed:
            self.closed = True
            fd = self.sock.fileno()
            if fd >= 0:
                self._loop.remove_reader(fd)
                self._loop.remove_writer(fd)
            fds.append(self.sock.detach())
        if fds or then is not None:  # an empty entry runs ``then`` after the uid's earlier closes
            self._closer.close(self._uid, fds, then)


class Closer:
    """Closes descriptors on worker threads, never on the event loop (Note [Closing off the loop]).

    Each uid's descriptors are closed in the order given, by one thread at a time; uids take
    turns; at most ``max_threads`` threads (daemon threads: one stuck in a lingering close
    never holds up the daemon's exit). ``then`` callbacks run on the loop that asked."""

    def __init__(self, max_threads: int = CLOSER_THREADS) -> None:
        self._max_threads = max_threads
        self._lock = threading.Lock()
        self._queues: dict[int | str, deque[tuple[list[int], Callable[[], None] | None, Any]]] = {}
        self._ready: deque[int | str] = deque()   # uids with something to close and no thread on them
        self._threads = 0
        self.pending = 0                     # descriptors not yet closed (tests, logs)

    def close(self, uid: int | str, fds: list[int], then: Callable[[], None] | None = None) -> None:
        loop = asyncio.get_running_loop() if then is not None else None
        with self._lock:
            queue = self._queues.get(uid)
            start = False
            if queue is None:  # a uid new to the queues: a thread of its own while there are threads to have
                queue = self._queues[uid] = deque()
                self._ready.append(uid)
                start = self._threads < self._max_threads
            queue.append((list(fds), then, loop))
            self.pending += len(fds)
            if start:
                self._threads += 1
        if start:
            try:
                threading.Thread(target=self._work, name="vtalloc-closer", daemon=True).start()
            except RuntimeError:  # no thread to be had now: the running ones get to it
                with self._lock:
                    self._threads -= 1

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._ready:
                    self._threads -= 1
                    return
                uid = self._ready.popleft()   # not in _ready while we work on it: one thread per uid
                fds, then, loop = self._queues[uid].popleft()
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            with self._lock:
                self.pending -= len(fds)
                if self._queues[uid]:
                    self._ready.append(uid)   # to the back: uids take turns
                else:
                    del self._queues[uid]
            if then is not None:
                try:
                    loop.call_soon_threadsafe(then)
                except RuntimeError:  # the loop is closed: the daemon has stopped
                    pass


class AcceptFailures:
    """A run of failed ``accept`` calls: how long to wait before the next, and rate-limited logs."""

    def __init__(self, clock: Any = time.monotonic, what: str = "side channel") -> None:
        self._clock = clock
        self.what = what           # the socket, in the log lines
        self.count = 0             # failures in the current run
        self.total = 0             # failures since the daemon started
        self._since = 0.0
        self._logged_at = 0.0

    def failed(self, e: OSError) -> float:
        """Count ``e``; returns the seconds to wait before accepting again."""
        now = self._clock()
        self.total += 1
        if self.count == 0:
            self._since = now
        self.count += 1
        hint = " (out of descriptors: too many sessions? see `vtalloc serve --max-sessions-per-uid` " \
               "and the daemon's RLIMIT_NOFILE)" if e.errno in (errno.EMFILE, errno.ENFILE) else ""
        if self.count == 1:
            log.warning("%s: accept failed: %s%s; retrying", self.what, e, hint)
            self._logged_at = now
        elif now - self._logged_at >= ACCEPT_LOG_EVERY_S:
            log.warning("%s: accept still failing: %d failures in %.0f s, the last: %s%s",
                        self.what, self.count, now - self._since, e, hint)
            self._logged_at = now
        return min(ACCEPT_BACKOFF_S * 2 ** min(self.count - 1, 16), ACCEPT_BACKOFF_MAX_S)

    def succeeded(self) -> None:
        if self.count:
            log.warning("%s: accepting again after %d failed accepts in %.1f s",
                        self.what, self.count, self._clock() - self._since)
            self.count = 0
