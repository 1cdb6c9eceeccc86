"""The side channel: a SOCK_SEQPACKET Unix socket beside the gRPC socket, for what gRPC cannot do.

Owns the wire format and the socket calls on both ends: peer identity (``SO_PEERCRED``,
and a pidfd from ``SO_PEERPIDFD`` or ``pidfd_open``), and page file descriptors pushed by
the daemon with ``SCM_RIGHTS``. A connection *is* a session: the daemon ends the session
(and takes its pages back) when the connection closes or the peer process exits.

Wire format: every message is one datagram of compact JSON (an object with a ``"t"`` type),
at most :data:`MAX_MESSAGE_BYTES`; a ``pages`` message carries one descriptor per page id,
at most :data:`MAX_FDS_PER_MESSAGE`. Client to daemon: ``hello`` (first, once) then only
``bye``. Daemon to client: ``session`` (the answer to hello) and ``pages``. Anything else,
a truncated datagram, or descriptors sent to the daemon, ends the connection.
Invariant: every descriptor received is either handed to the caller or closed here.
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
import struct
from typing import Any

__all__ = [
    "ProtocolError", "MAX_MESSAGE_BYTES", "MAX_FDS_PER_MESSAGE", "PROTOCOL_VERSION", "encode", "decode",
    "peer_credentials", "peer_pidfd", "connect", "send_message", "recv_message", "AsyncConnection",
    "side_channel_path",
]

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 8192
MAX_FDS_PER_MESSAGE = 128          # below the kernel's SCM_MAX_FD (253)
_SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5
_CRED = struct.Struct("3i")


class ProtocolError(ConnectionError):
    """The peer broke the side-channel protocol; the connection is dropped."""


def side_channel_path(control_path: str) -> str:
    """The side channel lives beside the control socket: ``x/vtalloc.sock`` -> ``x/vtalloc.fd.sock``."""
    root, ext = os.path.splitext(control_path)
    return f"{root}.fd{ext or '.sock'}"


def encode(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"side-channel message of {len(data)} bytes is over {MAX_MESSAGE_BYTES}")
    return data


def decode(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"undecodable side-channel message: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ProtocolError("side-channel message is not an object with a string 't'")
    return obj


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected, as the kernel recorded them."""
    return _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))


def peer_pidfd(sock: socket.socket, pid: int) -> int | None:
    """A pidfd for the peer: race-free ``SO_PEERPIDFD`` where the kernel has it, else ``pidfd_open``."""
    try:
        return struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD, 4))[0]
    except OSError:
        pass
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def connect(path: str, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout_s)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> None:
    data = encode(message)
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.send(data)


def _fds_from(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[: len(data) - len(data) % a.itemsize])
            fds.extend(a)
    return fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _parse(data: bytes, ancdata: list, flags: int, max_fds: int) -> tuple[dict[str, Any], list[int]]:
    fds = _fds_from(ancdata)
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolError("side-channel message or its descriptors were truncated")
        if not data:
            raise EOFError("the side channel was closed")
        if len(fds) > max_fds:
            raise ProtocolError(f"{len(fds)} descriptors where at most {max_fds} were expected")
        return decode(data), fds
    except BaseException:
        _close_all(fds)
        raise


def recv_message(sock: socket.socket, timeout_s: float | None, *, max_fds: int = MAX_FDS_PER_MESSAGE,
                 ) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors that came with it (the caller closes them).

    Raises EOFError when the peer closed, TimeoutError, or ProtocolError.
    """
    sock.settimeout(timeout_s)
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE_BYTES + 1, socket.CMSG_SPACE(max(max_fds, 1) * 4),
                                           socket.MSG_CMSG_CLOEXEC)
    return _parse(data, ancdata, flags, max_fds)


class AsyncConnection:
    """The daemon's end of one side-channel connection, on the event loop (non-blocking)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._loop = loop
        self.closed = False

    async def recv(self, timeout_s: float | None) -> dict[str, Any]:
        """The next message from the client; it may send no descriptors (ProtocolError if it does)."""
        fut: asyncio.Future[tuple[bytes, list, int]] = self._loop.create_future()
        fd = self.sock.fileno()

        def readable() -> None:
            if fut.done():
                return
            try:
                data, anc, flags, _ = self.sock.recvmsg(MAX_MESSAGE_BYTES + 1, socket.CMSG_SPACE(4 * 4),
                                                        socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                fut.set_exception(EOFError(f"side channel: {e}"))
                return
            fut.set_result((data, anc, flags))

        self._loop.add_reader(fd, readable)
        try:
            data, anc, flags = await asyncio.wait_for(fut, timeout_s)
        finally:
            if not self.closed:
                self._loop.remove_reader(fd)
        msg, fds = _parse(data, anc, flags, 0)
        return msg

    async def send(self, message: dict[str, Any], fds: list[int] = (), *, timeout_s: float) -> None:
        """Send one message, waiting (bounded) while the client's receive buffer is full."""
        data = encode(message)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        deadline = self._loop.time() + timeout_s
        while True:
            if self.closed:
                raise EOFError("the side channel is closed")
            try:
                self.sock.sendmsg([data], anc)
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
