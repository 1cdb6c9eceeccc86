"""The daemon's end of the side channel: peer identity and one connection on the event loop.

Owns: the socket calls only the daemon makes: peer identity (``SO_PEERCRED`` through
protocol/rendezvous.py, which clients use too, and a pidfd from ``SO_PEERPIDFD`` or ``pidfd_open``) and :class:`AsyncConnection` (non-blocking receive
and bounded send on the event loop). The wire format both ends speak is in
vtalloc.server.protocol.side_channel. A connection *is* a session: the daemon ends the
session (and takes its pages back) when the connection closes or the peer process exits.
:class:`AcceptFailures` paces and logs a failing ``accept`` (Note [Accept errors]).
Invariant: every descriptor received is either handed to the caller or closed here (a
client may send none: any it sends end the connection).

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
import time
from typing import Any

from .protocol.rendezvous import peer_credentials
from .protocol.side_channel import FD_BYTES, encode, parse_datagram, recv_datagram, send_datagram

__all__ = ["peer_credentials", "peer_pidfd", "AsyncConnection", "AcceptFailures"]

log = logging.getLogger("vtalloc.server")

ACCEPT_BACKOFF_S = 0.02
ACCEPT_BACKOFF_MAX_S = 0.5
ACCEPT_LOG_EVERY_S = 10.0

_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5; older Pythons lack the name
# A client may send no descriptors; room for a few lets recvmsg see (and refuse) any it sends.
_STRAY_FDS_SEEN = 4


def peer_pidfd(sock: socket.socket, pid: int) -> int | None:
    """A pidfd for the peer: race-free ``SO_PEERPIDFD`` where the kernel has it, else ``pidfd_open``."""
    try:
        return struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD, FD_BYTES))[0]
    except OSError:
        pass
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


class AsyncConnection:
    """The daemon's end of one side-channel connection, on the event loop (non-blocking)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._loop = loop
        self.closed = False

    async def recv(self, timeout_s: float | None) -> dict[str, Any]:
        """The next message from the client; it may send no descriptors (ProtocolError if it does)."""
        fut: asyncio.Future[tuple[bytes, list[int], int]] = self._loop.create_future()
        fd = self.sock.fileno()

        def readable() -> None:
            if fut.done():
                return
            try:
                received = recv_datagram(self.sock, _STRAY_FDS_SEEN)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                fut.set_exception(EOFError(f"side channel: {e}"))
                return
            fut.set_result(received)

        self._loop.add_reader(fd, readable)
        try:
            data, fds, flags = await asyncio.wait_for(fut, timeout_s)
        finally:
            if not self.closed:
                self._loop.remove_reader(fd)
        msg, _ = parse_datagram(data, fds, flags, 0)
        return msg

    async def send(self, message: dict[str, Any], fds: list[int] = (), *, timeout_s: float) -> None:
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
            fd = self.sock.fileno()
            self._loop.add_writer(fd, lambda: fut.done() or fut.set_result(None))
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                if not self.closed:
                    self._loop.remove_writer(fd)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        fd = self.sock.fileno()
        if fd >= 0:
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        self.sock.close()


class AcceptFailures:
    """A run of failed ``accept`` calls: how long to wait before the next, and rate-limited logs."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
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
            log.warning("side channel: accept failed: %s%s; retrying", e, hint)
            self._logged_at = now
        elif now - self._logged_at >= ACCEPT_LOG_EVERY_S:
            log.warning("side channel: accept still failing: %d failures in %.0f s, the last: %s%s",
                        self.count, now - self._since, e, hint)
            self._logged_at = now
        return min(ACCEPT_BACKOFF_S * 2 ** min(self.count - 1, 16), ACCEPT_BACKOFF_MAX_S)

    def succeeded(self) -> None:
        if self.count:
            log.warning("side channel: accepting again after %d failed accepts in %.1f s",
                        self.count, self._clock() - self._since)
            self.count = 0
