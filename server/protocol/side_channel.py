"""The side channel's wire format: a SOCK_SEQPACKET Unix socket beside the gRPC socket.

Owns what both ends speak, and the blocking calls a client uses: every message is one
datagram of compact JSON (an object with a ``"t"`` type), at most :data:`MAX_MESSAGE_BYTES`;
a ``pages`` message carries one descriptor per page id, at most
:data:`MAX_FDS_PER_MESSAGE`. Client to daemon: ``hello`` (first, once, with
:data:`PROTOCOL_VERSION`, a JSON integer) then only ``bye``. Daemon to client: ``session`` (the answer to
hello), or ``refused`` instead (``error``: the name of a class of protocol/errors.py, e.g.
LimitExceededError, ``message``, and ``retry``: true when the refusal is about the moment and the
same hello may succeed shortly; then the daemon closes), and ``pages``. Anything else, a truncated datagram, or descriptors sent to the
daemon, ends the connection. The daemon's end of a connection (peer identity, the event
loop) is in vtalloc.server.side_channel.
Invariant: every descriptor received is either handed to the caller or closed here.
"""

from __future__ import annotations

import array
import json
import os
import socket
from typing import Any, Sequence

__all__ = [
    "ProtocolError", "MAX_MESSAGE_BYTES", "MAX_FDS_PER_MESSAGE", "PROTOCOL_VERSION", "FD_BYTES", "encode",
    "decode", "version_of", "send_datagram", "recv_datagram", "parse_datagram", "connect", "send_message", "recv_message",
]

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 8192
MAX_FDS_PER_MESSAGE = 128          # below the kernel's SCM_MAX_FD (253)
FD_BYTES = array.array("i").itemsize  # one descriptor in SCM_RIGHTS data


class ProtocolError(ConnectionError):
    """The peer broke the side-channel protocol; the connection is dropped."""


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
    except RecursionError:  # nesting deeper than the interpreter's stack: "[[[[...", at most 8 KiB
        raise ProtocolError("side-channel message nests too deeply") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
        raise ProtocolError("side-channel message is not an object with a string 't'")
    return obj


def version_of(message: dict[str, Any]) -> int | None:
    """The message's protocol version ``"v"``, or None unless it is a JSON integer (not
    ``true``, ``1.0`` or ``"1"``: Python's ``True == 1`` must not pass as version 1)."""
    v = message.get("v")
    return v if type(v) is int else None


def connect(path: str, timeout_s: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout_s)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def send_datagram(sock: socket.socket, data: bytes, fds: Sequence[int] = ()) -> None:
    """One datagram, with its descriptors (``socket.send_fds``) if any."""
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def send_message(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    send_datagram(sock, encode(message), fds)


def recv_datagram(sock: socket.socket, max_fds: int, size: int = MAX_MESSAGE_BYTES + 1) -> tuple[bytes, list[int], int]:
    """One datagram (of at most ``size`` bytes; on a stream socket, what one receive gives: the
    gRPC front door's), its descriptors and recvmsg's flags; room for ``max_fds`` descriptors
    (at least one, so that strays are seen and refused).

    Not ``socket.recv_fds``: up to at least Python 3.13 it ignores its ``flags`` argument
    (CPython gh-107898), so MSG_CMSG_CLOEXEC would be lost and a fork+exec in another thread
    could leak page descriptors into a child before they could be marked close-on-exec."""
    data, ancdata, flags, _ = sock.recvmsg(size, socket.CMSG_SPACE(max(max_fds, 1) * FD_BYTES), socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds), flags


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def parse_datagram(data: bytes, fds: list[int], flags: int, max_fds: int) -> tuple[dict[str, Any], list[int]]:
    """One received datagram (:func:`recv_datagram`'s data, descriptors and flags) as a message
    and its descriptors; on any error the descriptors are closed."""
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
    return parse_datagram(*recv_datagram(sock, max_fds), max_fds)
