"""A session with the per-node daemon: the side-channel connection, the gRPC channel, the token.

Owns: opening a session (check that the rendezvous is trusted, protocol/rendezvous.py;
connect the side channel, say hello (with the quota the process declares in
``$VTALLOC_QUOTA_MIN``/``$VTALLOC_QUOTA_MAX``, protocol/declared_quota.py), receive the session token and
the node's geometry), calling RPCs with the token and a timeout on every call, receiving the
page descriptors a lease pushes, and ending the session (``bye``). A refusal the daemon marks as
about the moment (``retry``: a burst of one uid's opens) is tried again, jittered, within the
timeout; any other is raised at once. Every gRPC failure is
raised as the service's typed errors (vtalloc.server.protocol.errors); a daemon that is gone gives
ServiceUnavailableError at once, never a hang. Invariants: the session belongs to the process
that opened it (a forked child gets ClosedError and never touches the parent's session);
every descriptor received is either returned to the caller or closed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import select
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Iterable

import grpc

from vtalloc.allocator._handle import Unique
from vtalloc.allocator.errors import ClosedError, VtallocError
from vtalloc.server.proto.vtalloc.v1 import admin_pb2_grpc, pages_pb2, pages_pb2_grpc
from vtalloc.server.protocol.address import UNIX_SCHEME, default_socket_path, parse_address, side_channel_path
from vtalloc.server.protocol.declared_quota import declared_from_env, hello_field
from vtalloc.server.protocol.errors import (PermissionDeniedError, ServiceUnavailableError, UntrustedRendezvousError,
                                            error_by_name, error_from_rpc)
from vtalloc.server.protocol.rendezvous import check_directory, check_peer, check_socket, trusted_uids
from vtalloc.server.protocol.rpc import MAX_REPLY_BYTES, SESSION_KEY
from vtalloc.server.protocol.side_channel import PROTOCOL_VERSION, ProtocolError, connect, recv_message, send_message

__all__ = ["ServiceSession", "SessionHello", "DEFAULT_RPC_TIMEOUT_S", "verify_daemon"]

DEFAULT_RPC_TIMEOUT_S = 5.0
log = logging.getLogger("vtalloc.client")
# gRPC's own text for a call that failed before it left this process (no connection).
_NOT_CONNECTED = "failed to connect to all addresses"
_REFUSAL_CHARS = 512  # the most of a daemon's refusal message quoted
# A refusal the daemon marks ``retry`` (one uid's opens in a burst: its connections waiting for
# their hello, or opened faster than the daemon paces them) is tried again after a jittered
# wait, doubling from the first to the most, until the session's timeout_s has passed.
_RETRY_FIRST_S, _RETRY_MAX_S = 0.02, 0.5


def _never_sent(e: grpc.RpcError) -> bool:
    code = e.code() if hasattr(e, "code") else None
    return code == grpc.StatusCode.UNAVAILABLE and _NOT_CONNECTED in (e.details() or "")


# gRPC's retry policy, for Watch only: it changes nothing on the daemon, so a Watch that ends
# UNAVAILABLE (the daemon restarting its listener, a connection reset) is re-sent with
# exponential backoff. Every other call is sent at most once by gRPC (a lease or a return must
# not run twice); the one re-send the session makes itself is for a call that never left this
# process (_never_sent).
_SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": pages_pb2.DESCRIPTOR.services_by_name["Pages"].full_name, "method": "Watch"}],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}]})

_CHANNEL_OPTIONS = [
    ("grpc.enable_retries", 1),
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", MAX_REPLY_BYTES),
]


@dataclass(frozen=True)
class SessionHello:
    """What the daemon said when the session opened."""

    session_id: str
    pid: int
    uid: int
    principal: str
    backend: str
    device: int
    page_bytes: int
    capacity_bytes: int
    host_capacity_bytes: int
    evict_deadline_s: float


def _unavailable(socket_path: str, where: str, e: OSError) -> VtallocError:
    """The error for a daemon that cannot be reached at ``socket_path`` (the address the user gave),
    naming ``where`` it failed when that is another file (the side channel beside it)."""
    at = socket_path if where == socket_path else f"{socket_path} (its side channel {where})"
    if e.errno in (errno.EACCES, errno.EPERM):
        return PermissionDeniedError(
            f"cannot reach the vtalloc daemon at {at}: permission denied (the socket directory lets in "
            "only its owner and group; ask for the group given to `vtalloc serve --group`)")
    return ServiceUnavailableError(f"no vtalloc daemon answers at {at} ({e.strerror or e}); start one with "
                                   "`vtalloc serve`")


def _connect_trusted(socket_path: str, side_path: str, trusted: frozenset[int], timeout_s: float) -> socket.socket:
    """The side channel, connected, once the rendezvous is trusted: the directory (and its
    ancestors), both socket files, and the uid of the process behind each socket (the gRPC
    socket through a connection opened and closed for the check; nobody else can replace the
    socket after it, since nobody else can write the directory). Nothing has been sent yet."""
    where = socket_path  # what the user gave: its directory, then the sockets
    try:
        check_directory(os.path.dirname(socket_path), trusted)
        for where in (socket_path, side_path):
            check_socket(where, trusted)
        where = side_path
        sock = connect(side_path, timeout_s)
        try:
            check_peer(sock, side_path, trusted)
            where = socket_path
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as probe:
                probe.settimeout(timeout_s)
                probe.connect(socket_path)
                check_peer(probe, socket_path, trusted)
        except BaseException:
            sock.close()
            raise
    except UntrustedRendezvousError:
        raise
    except OSError as e:
        raise _unavailable(socket_path, where, e) from None
    return sock


def verify_daemon(address: str, timeout_s: float = DEFAULT_RPC_TIMEOUT_S, daemon_uids: Iterable[int] = ()) -> None:
    """Check, sending nothing, that the daemon at ``address`` is one this user trusts (as a
    session does before its hello); UntrustedRendezvousError or ServiceUnavailableError if not."""
    socket_path = parse_address(address)
    _connect_trusted(socket_path, side_channel_path(socket_path), trusted_uids(daemon_uids), timeout_s).close()


class ServiceSession(Unique):
    def __init__(self, address: str | None = None, *, kind: str = "client",
                 timeout_s: float = DEFAULT_RPC_TIMEOUT_S, daemon_uids: Iterable[int] = ()) -> None:
        """Open a session with the daemon at ``address`` (default: the default socket). Before
        anything is sent, the socket directory, both sockets and the daemon's uid are checked
        (protocol/rendezvous.py): they must be this user's, root's, or a uid in ``daemon_uids``
        or ``$VTALLOC_DAEMON_UIDS``; otherwise UntrustedRendezvousError."""
        self.address = address or UNIX_SCHEME + default_socket_path()
        self.socket_path = parse_address(self.address)
        self.side_path = side_channel_path(self.socket_path)
        self.timeout_s = timeout_s
        self.kind = kind
        self._pid = os.getpid()
        self._closed = False
        self._dead = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._channel: grpc.Channel | None = None
        self.daemon_uids = trusted_uids(daemon_uids)
        # $VTALLOC_QUOTA_MIN/MAX (a pod's own limits): checked before anything is sent; a client's only
        declared = declared_from_env() if kind == "client" else None
        deadline = time.monotonic() + timeout_s
        delay = _RETRY_FIRST_S
        while True:
            self._sock = _connect_trusted(self.socket_path, self.side_path, self.daemon_uids, timeout_s)
            try:
                msg = self._hello(declared, timeout_s)
                if msg.get("t") != "refused":
                    self._token = msg["token"]
                    self.hello = SessionHello(**{k: msg[k] for k in SessionHello.__dataclass_fields__})
                    break
            except VtallocError:
                self._sock.close()
                self._sock = None
                raise
            except (OSError, EOFError, KeyError, TypeError) as e:
                self._sock.close()
                self._sock = None
                raise ServiceUnavailableError(f"the vtalloc daemon at {self.side_path} did not open a session: "
                                              f"{e}") from None
            self._sock.close()
            self._sock = None
            error = error_by_name(msg.get("error"), f"the vtalloc daemon at {self.side_path} refused a session: "
                                  f"{str(msg.get('message'))[:_REFUSAL_CHARS]}")
            wait = random.uniform(0.5, 1.0) * delay  # jittered: a burst of opens does not come back at once
            if msg.get("retry") is not True or time.monotonic() + wait > deadline:
                raise error
            time.sleep(wait)
            delay = min(2 * delay, _RETRY_MAX_S)
        self._metadata = ((SESSION_KEY, self._token),)
        self._channel = grpc.insecure_channel(UNIX_SCHEME + self.socket_path, options=_CHANNEL_OPTIONS)
        self.pages = pages_pb2_grpc.PagesStub(self._channel)
        self.admin = admin_pb2_grpc.AdminStub(self._channel)
        self._finalizer = weakref.finalize(self, _close_quietly, self._sock, self._channel)
        _live_sessions.add(self)

    def _hello(self, declared: Any, timeout_s: float) -> dict[str, Any]:
        """Say hello on the connected side channel: the session message, or a refusal (returned,
        for the caller to raise or retry)."""
        sock = self._side()
        try:
            send_message(sock, {"t": "hello", "v": PROTOCOL_VERSION, "kind": self.kind, **hello_field(declared)})
        except OSError:
            pass  # refused before the hello arrived (a limit): the reason waits to be read
        msg, _ = recv_message(sock, timeout_s, max_fds=0)
        if msg.get("t") == "refused":
            return msg
        if msg.get("t") != "session" or not isinstance(msg.get("token"), str):
            raise ProtocolError(f"expected the session message, got {msg.get('t')!r}")
        return msg

    @property
    def session_id(self) -> str:
        return self.hello.session_id

    # -- state ------------------------------------------------------------------------------
    def _side(self) -> socket.socket:
        """The side-channel socket (None only before the hello or after close)."""
        if self._sock is None:
            raise ClosedError("the vtalloc session is closed")
        return self._sock

    def _usable(self) -> None:
        if os.getpid() != self._pid:
            raise ClosedError("this vtalloc session belongs to the parent process; open a new one after fork")
        if self._closed:
            raise ClosedError("the vtalloc session is closed")
        if self._dead:
            raise ServiceUnavailableError("the vtalloc daemon ended this session (it stopped or restarted)")

    @property
    def alive(self) -> bool:
        """False once the daemon closed the side channel (it stopped, restarted, or dropped us)."""
        if self._closed or self._dead or os.getpid() != self._pid:
            return False
        with self._lock:
            try:
                sock = self._side()
                readable, _, _ = select.select([sock], [], [], 0)
                if readable and not sock.recv(1, socket.MSG_PEEK):
                    self._dead = True
            except OSError:
                self._dead = True
        return not self._dead

    def mark_dead(self) -> None:
        self._dead = True

    # -- calls ------------------------------------------------------------------------------
    def call(self, stub: Any, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """``stub.method(request)`` with the session token and a timeout; typed errors on failure.

        A call the channel could not even send (it failed to connect: under load the daemon's
        accept queue can be full for a moment) while the side channel shows the daemon alive is
        sent once more, waiting for the channel within the same timeout. The daemon never saw
        the first one, so nothing is done twice; a daemon that is gone still fails at once.
        """
        self._usable()
        timeout = timeout_s or self.timeout_s
        fn = getattr(stub, method)
        try:
            try:
                return fn(request, timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                if not (_never_sent(e) and self.alive):
                    raise
                log.info("%s: the channel could not connect while the daemon is alive; sending again", method)
                return fn(request, timeout=timeout, metadata=self._metadata, wait_for_ready=True)
        except grpc.RpcError as e:
            err = error_from_rpc(e, method)
            if isinstance(err, ServiceUnavailableError) and not self.alive:
                err = ServiceUnavailableError(f"{method}: the vtalloc daemon is gone (stopped or restarting); "
                                              "pages already mapped keep working")
            raise err from None

    def watch(self, timeout_s: float) -> Any:
        """The Watch stream (iterate it; ``.cancel()`` it to stop)."""
        self._usable()
        return self.pages.Watch(pages_pb2.WatchRequest(), timeout=timeout_s, metadata=self._metadata)

    def recv_pages(self, timeout_s: float) -> tuple[dict[str, Any], list[int]]:
        """The next ``pages`` message and its descriptors (the caller closes them)."""
        self._usable()
        with self._lock:
            try:
                msg, fds = recv_message(self._side(), timeout_s)
            except EOFError:
                self._dead = True
                raise ServiceUnavailableError("the vtalloc daemon closed the session while delivering pages") from None
            except (TimeoutError, socket.timeout):
                raise ServiceUnavailableError(f"no pages arrived on the side channel within {timeout_s} s") from None
        if msg.get("t") != "pages" or not isinstance(msg.get("page_ids"), list):
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"expected a pages message, got {msg.get('t')!r}")
        if len(fds) != len(msg["page_ids"]):
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"{len(msg['page_ids'])} page ids came with {len(fds)} descriptors")
        return msg, fds

    def close(self) -> None:
        """End the session: say goodbye (the daemon releases what it still counts as ours)."""
        if self._closed:
            return
        self._closed = True
        _live_sessions.discard(self)
        if os.getpid() == self._pid and not self._dead and self._sock is not None:
            try:
                send_message(self._sock, {"t": "bye"})
            except OSError:
                pass
        self._finalizer()

    def __enter__(self) -> "ServiceSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_quietly(sock: socket.socket | None, channel: grpc.Channel | None) -> None:
    if sock is not None:
        sock.close()
    if channel is not None:
        channel.close()


_live_sessions: "weakref.WeakSet[ServiceSession]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The child shares the parent's side-channel socket; close its copy (the parent's
    # session is unaffected) so the child can never act as the parent.
    for s in list(_live_sessions):
        s._closed = True
        s._finalizer.detach()  # never close the parent's gRPC channel from the child
        if s._sock is not None:
            s._sock.close()


os.register_at_fork(after_in_child=_after_fork_in_child)
