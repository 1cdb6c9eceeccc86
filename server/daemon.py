"""The daemon's lifecycle: socket directory, gRPC server, side channel, metrics.

Owns: running a :class:`~.daemon_config.DaemonConfig` (its options are daemon_config.py's; the
options only the backend can judge are judged here before anything is touched, so every bad
option is an InvalidArgumentError), the socket directory (created 0750; one it did not create
is used only as it is, never chmod'ed or chgrp'ed: one that does not fit is refused with the
reason, an UntrustedRendezvousError), the
single-daemon lock (``flock`` on ``<socket>.lock``, released by the kernel if we die, so a
stale socket is safely removed), the gRPC server (health checking and reflection on; it
listens on a private socket behind the daemon's own front door on the public one,
grpc_front.py, Note [The front door]) and an orderly stop on SIGTERM/SIGINT: health goes NOT_SERVING, clients are told on Watch,
sessions end, pages are released (clients keep what they have mapped, and the state file
``<socket>.state`` says so to the next daemon: state_keeper.py).
Must not: hold a page or a session itself; logic lives in ledger.py and node.py.
"""

from __future__ import annotations

import asyncio
import fcntl
import grp
import json
import logging
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from vtalloc.allocator.page_pool import PagePool

from .daemon_config import DaemonConfig
from .errors import ErrorInterceptor
from .ledger import Ledger, NodeGeometry
from .grpc_front import GrpcFront, connections_per_uid
from .limits import RpcLimiter, RpcSlots
from .node import Node
from .page_reclaim import reclaim_of
from .principals import boot_ticks_now, limit_key, own_cgroup
from .side_channel import peer_pidfd
from .proto.vtalloc.v1 import admin_pb2_grpc, pages_pb2_grpc
from .protocol.address import UNIX_SCHEME
from .protocol.errors import FailedPreconditionError, UntrustedRendezvousError
from .protocol.rendezvous import check_directory
from .protocol.rpc import MAX_REPLY_BYTES, SERVICE_NAMES
from .reflection import enable_reflection
from .service import AdminService, PagesService
from .state_keeper import StateKeeper

__all__ = ["DaemonConfig", "run_daemon", "serve"]

log = logging.getLogger("vtalloc.server")

_LISTEN_BACKLOG = 128
_SOCKET_MODE = 0o660                       # owner and the --group
_DIRECTORY_MODE = 0o750
_STOP_GRACE_S = 1.0                        # in-flight RPCs may finish this long on a clean stop
_METRICS_JOIN_S = 2.0
_PRIVATE_PREFIX = ".vtg"                    # <socket dir>/.vtgXXXXXXXX/g.sock: the gRPC server's own socket
_MAX_UNIX_PATH = 107


def _private_socket(sock_dir: Path) -> tuple[str, str]:
    """(a new 0700 directory only this uid can enter, the gRPC server's socket path in it):
    in the socket directory when the path fits a Unix socket address, else in the temporary one.
    Leftovers of a daemon that died there are removed first (the caller holds the lock)."""
    for stale in sock_dir.glob(_PRIVATE_PREFIX + "*"):
        if stale.is_dir() and not stale.is_symlink() and stale.stat().st_uid == os.geteuid():
            shutil.rmtree(stale, ignore_errors=True)
    where = str(sock_dir) if len(str(sock_dir)) + len(_PRIVATE_PREFIX) + 16 <= _MAX_UNIX_PATH else None
    private = tempfile.mkdtemp(prefix=_PRIVATE_PREFIX, dir=where)   # mode 0700, ours, a fresh name
    return private, os.path.join(private, "g.sock")


def _prepare_directory(path: Path, gid: int, group: str | None) -> None:
    """Create the socket directory 0750 (group ``gid`` when given), or use an existing one only
    if it fits as it is: this daemon's own, not a link, not writable by group or others, not
    open to others, and with ``--group`` that group's and enterable by it. A directory this
    daemon did not create is never changed (mode or group): one that does not fit is refused,
    with the reason, as is one under an ancestor others could change (protocol/rendezvous.py:
    the checks clients make too)."""
    try:
        path.mkdir(parents=True, mode=_DIRECTORY_MODE)
        created = True
    except FileExistsError:
        created = False
    st = check_directory(str(path), frozenset({os.geteuid()}))
    mode = stat.S_IMODE(st.st_mode)
    if created:  # ours: the mode the umask left, and the group, are set here (it is empty yet)
        if gid != -1:
            os.chown(path, -1, gid)
        os.chmod(path, _DIRECTORY_MODE)
        return
    if mode & 0o007:
        raise UntrustedRendezvousError(
            f"{path} is open to every user (mode {mode:04o}); the daemon does not change a directory it did not "
            "create: put the socket in a private directory, e.g. the default under $XDG_RUNTIME_DIR or "
            "/run/vtalloc, or make this one 0750 yourself")
    if gid != -1 and st.st_gid != gid:
        raise UntrustedRendezvousError(
            f"{path} belongs to group {_group_name(st.st_gid)}, not to --group {group}; the daemon does not change "
            f"a directory it did not create: chgrp it yourself, or use another directory")
    if gid != -1 and not mode & stat.S_IXGRP:  # connecting needs search permission on the directory
        raise UntrustedRendezvousError(
            f"{path} has mode {mode:04o}: members of --group {group} cannot enter it; the daemon does not change "
            "a directory it did not create: make it 0750 yourself, or use another directory")


def _group_name(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


class _Lock:
    """``flock`` on ``<socket>.lock``: one daemon per socket; the kernel drops it if we die."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise FailedPreconditionError(f"another vtalloc daemon already serves {path[:-len('.lock')]}") from None

    def release(self) -> None:
        os.close(self.fd)


def _sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) our state, if it started us."""
    target = os.environ.get("NOTIFY_SOCKET")
    if not target:
        return
    if target.startswith("@"):
        target = "\0" + target[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.connect(target)
            s.sendall(message.encode())
        except OSError as e:
            log.warning("could not notify systemd: %s", e)


async def serve(config: DaemonConfig, *, on_ready: Callable[[dict], None] | None = None,
                stop: asyncio.Event | None = None, stopped_by: list[int] | None = None) -> None:
    """Run the daemon until ``stop`` is set (or SIGTERM/SIGINT: the signal is appended to ``stopped_by``)."""
    loop = asyncio.get_running_loop()
    sock_path = Path(config.socket_path)
    gid = config.group_gid
    # The options only the backend can judge (page size, capacity, quotas against it) first,
    # before the directory is touched: InvalidArgumentError from here is a bad option.
    pool = PagePool(config=config.pages)
    page_pool: PagePool | None = pool  # None once a clean stop handed it to node.close()
    lock = listener = metrics = keeper = front = grpc_listener = private = None
    server = None
    side_task = None
    try:
        info = pool.info()
        geometry = NodeGeometry(info.backend, info.device, info.page_bytes, info.capacity_bytes // info.page_bytes,
                                int(config.host_capacity or 0), config.evict_deadline_s,  # an int since __post_init__
                                reclaim=reclaim_of(info.backend))
        admins = {0, os.geteuid(), *config.admin_uids}
        admin_cgroups = None
        if config.principal_by == "pod":
            own = own_cgroup()
            if not own:
                raise FailedPreconditionError("--principal-by pod needs cgroup v2: /proc/self/cgroup has no '0::' line")
            admin_cgroups = (own, *config.admin_cgroups)
        ledger = Ledger(geometry, default_quota=config.default_quota, quotas=config.quotas,
                        principals=config.principals, admin_uids=admins, admin_cgroups=admin_cgroups)
        _prepare_directory(sock_path.parent, gid, config.group)
        lock = _Lock(config.socket_path + ".lock")
        for stale in (config.socket_path, config.side_channel_path):
            if os.path.lexists(stale):
                os.unlink(stale)
        node = Node(pool, ledger, kill_on_missed_deadline=config.kill_on_missed_deadline, limits=config.limits,
                    principal_by=config.principal_by)
        keeper = StateKeeper(config.state_path, ledger, node.changes.changed)
        inherited_bytes = keeper.adopt()  # before any lease: what a previous daemon's clients still hold
        node.changes.on_holdings_changed = keeper.save

        def identify(token: str | None) -> tuple[int | str, bool]:
            s = ledger.sessions.authenticate(token)
            return limit_key(s.uid, s.pod), ledger.sessions.is_admin(s)

        def connection_key(sock: socket.socket, pid: int, uid: int) -> int | str:
            """Whom a gRPC connection counts against: its uid, or its pod (read as the side channel reads it)."""
            if config.principal_by != "pod":
                return uid
            accepted = boot_ticks_now()
            pidfd, exact = peer_pidfd(sock, pid)
            try:
                ident = node.connections.identify(sock, pid, pidfd, exact, accepted)  # PeerIdentityError: refused
            finally:
                if pidfd is not None:
                    os.close(pidfd)
            return limit_key(uid, ident.pod if ident else None)

        # Not gRPC's maximum_concurrent_rpcs: it counts calls before their caller is known.
        rpc_slots = RpcSlots(config.limits.max_rpcs_per_uid, config.max_concurrent_rpcs)
        server = grpc.aio.server(
            interceptors=[RpcLimiter(rpc_slots, identify), ErrorInterceptor()],
            options=[("grpc.max_receive_message_length", config.max_message_bytes),
                     ("grpc.max_send_message_length", MAX_REPLY_BYTES)])
        pages_pb2_grpc.add_PagesServicer_to_server(PagesService(node), server)
        admin_pb2_grpc.add_AdminServicer_to_server(AdminService(node), server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        enable_reflection((*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name), server)
        private, upstream = _private_socket(sock_path.parent)
        if server.add_insecure_port(UNIX_SCHEME + upstream) == 0:
            raise OSError(f"could not bind {upstream}")
        grpc_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        grpc_listener.bind(config.socket_path)
        grpc_listener.listen(_LISTEN_BACKLOG)
        front = GrpcFront(grpc_listener, upstream, per_uid=connections_per_uid(config.limits.max_sessions_per_uid),
                          closer=node.connections.closer, identify=connection_key, session_keys=ledger.sessions.limit_keys)

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        listener.bind(config.side_channel_path)
        listener.listen(_LISTEN_BACKLOG)
        await server.start()
        front.start()
        for path in (config.socket_path, config.side_channel_path):
            os.chown(path, -1, gid)
            os.chmod(path, _SOCKET_MODE)
        side_task = loop.create_task(node.connections.serve_side_channel(listener))
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

        metrics_url = None
        if config.metrics_port is not None:
            from .metrics import start_metrics_server

            metrics = start_metrics_server(ledger, config.metrics_port, config.metrics_addr)
            metrics_url = f"http://{config.metrics_addr}:{metrics[0].server_port}/metrics"

        stop = stop or asyncio.Event()
        def on_signal(sig: int, stop: asyncio.Event = stop) -> None:
            if stopped_by is not None:
                stopped_by.append(sig)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, on_signal, sig)
            except (NotImplementedError, RuntimeError):  # not the main thread (tests): stop via the event
                pass
        ready = {"event": "ready", "pid": os.getpid(), "control": UNIX_SCHEME + config.socket_path,
                 "side_channel": config.side_channel_path, "metrics": metrics_url, "backend": info.backend,
                 "device": info.device, "page_bytes": info.page_bytes, "capacity_bytes": geometry.capacity_bytes,
                 "inherited_bytes": inherited_bytes}
        log.info("ready: %s", json.dumps(ready))
        if on_ready:
            on_ready(ready)
        _sd_notify("READY=1")

        await stop.wait()

        log.info("stopping")
        _sd_notify("STOPPING=1")
        await health_servicer.enter_graceful_shutdown()
        node.peers.announce_shutdown("the vtalloc daemon is stopping")
        side_task.cancel()
        await asyncio.gather(side_task, return_exceptions=True)
        side_task = None
        await server.stop(grace=_STOP_GRACE_S)  # in-flight calls finish through the front door
        server = None
        keeper.freeze()  # the clients keep their mapped pages: the next daemon must count them
        await node.close()
        page_pool = None
    finally:
        if keeper is not None:
            keeper.close()
        if side_task is not None:
            side_task.cancel()
            await asyncio.gather(side_task, return_exceptions=True)
        if server is not None:
            await server.stop(grace=None)
        if front is not None:
            front.stop()
        if grpc_listener is not None:
            grpc_listener.close()
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
        if page_pool is not None:
            page_pool.close()
        if listener is not None:
            listener.close()
        if metrics is not None:
            metrics[0].shutdown()
            metrics[0].server_close()
            metrics[1].join(timeout=_METRICS_JOIN_S)
        if lock is not None:  # the sockets are this daemon's only once it holds the lock
            for path in (config.socket_path, config.side_channel_path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            lock.release()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.remove_signal_handler(sig)
            except (NotImplementedError, RuntimeError):
                pass


def run_daemon(config: DaemonConfig, *, log_level: str = "INFO",
               then: Callable[[dict], None] | None = None) -> int | None:
    """Blocking entry point of ``vtalloc serve``: logs to stderr, prints the ready line as JSON on
    stdout, then calls ``then(ready)`` (the CLI's notes on it). Returns the signal that stopped
    it (SIGTERM or SIGINT), if one did: the CLI exits 130 after Ctrl-C, 0 after SIGTERM."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s vtalloc-serve %(levelname)s %(message)s")

    def on_ready(ready: dict) -> None:
        print(json.dumps(ready), flush=True)
        if then:
            then(ready)

    stopped_by: list[int] = []
    asyncio.run(serve(config, on_ready=on_ready, stopped_by=stopped_by))
    return stopped_by[0] if stopped_by else None
