"""How the daemon runs: its options, each checked and normalized once.

Owns: :class:`DaemonConfig` (a frozen dataclass, validated here: sizes parsed, the socket path
made an absolute Unix socket path, the group resolved to its gid, uids, quotas, cgroups and
limits checked; every bad option is an InvalidArgumentError naming it) and the bounds it checks
against. The options only the backend can judge (page size, capacity, quota minimums) are
judged by daemon.py before anything is touched.
Invariants: a DaemonConfig that exists is valid as far as it can be judged without the backend;
it is never changed after construction.
"""

from __future__ import annotations

import grp
from dataclasses import dataclass, field

from vtalloc.allocator.config import Config, parse_size
from vtalloc.allocator.errors import InvalidArgumentError

from .limits import SessionLimits
from .principals import PRINCIPAL_MODES
from .protocol.address import parse_address, side_channel_path
from .protocol.rendezvous import MAX_UID
from .quota import PrincipalMap, Quota

__all__ = ["DaemonConfig"]

# sun_path holds 108 bytes with its NUL; a few are kept for the lock file's suffix.
_MAX_SOCKET_PATH_BYTES = 100
_EVICT_DEADLINE_RANGE_S = (0.05, 600.0)    # shorter cannot be met; longer stalls a waiting lease
# A request must hold a full Return or Report (MAX_RETURN_PAGES page ids: about 1 MiB); 1 GiB is gRPC's bound.
_MAX_MESSAGE_RANGE = (2 << 20, 1 << 30)
_MAX_CONCURRENT_RPCS = 1 << 20


@dataclass(frozen=True)
class DaemonConfig:
    """How the daemon runs; every field is normalized here, once (sizes parsed, paths absolute)."""

    socket_path: str                       # the gRPC socket; the side channel is <stem>.fd.sock beside it
    pages: Config = field(default_factory=Config)  # the page pool: backend ("auto", "host": memfd pages,
                                           # no GPU, "cuda"), device (one daemon per device), capacity
                                           # (bytes the node may lease) and page size; None: the backend's
    host_capacity: int | str | None = None  # host bytes each client may use for evicted pages (None: client default)
    metrics_port: int | None = None        # serve Prometheus metrics here (0: any free port; None: off)
    metrics_addr: str = "127.0.0.1"
    group: str | None = None               # group that may reach the sockets (directory 0750)
    admin_uids: tuple[int, ...] = ()       # besides root and the daemon's own uid
    default_quota: Quota | None = None     # for principals without their own (default 0 .. capacity)
    quotas: tuple[Quota, ...] = ()
    principals: PrincipalMap = field(default_factory=PrincipalMap)
    evict_deadline_s: float = 2.0          # how long a client has to answer an eviction request
    kill_on_missed_deadline: bool = True   # see node_pressure.py, Note [Missed eviction deadline]
    max_message_bytes: int | str = 4 << 20  # larger requests get RESOURCE_EXHAUSTED from gRPC itself
    max_concurrent_rpcs: int = 4096        # calls of non-admin uids at once, after each uid's own limit
                                           # (limits.py, Note [Calls per uid]); more get RESOURCE_EXHAUSTED
    limits: SessionLimits = field(default_factory=SessionLimits)  # sessions, pending connections and calls
                                           # per uid, the hello timeout (limits.py; docs/service.md, "Limits")
    principal_by: str = "uid"              # "uid", or "pod": a client in a kubelet pod's cgroup is its pod
                                           # (principals.py; docs/kubernetes.md)
    admin_cgroups: tuple[str, ...] = ()    # with "pod": cgroups (and below) whose admin uids are admins,
                                           # besides the daemon's own cgroup
    group_gid: int = field(init=False, default=-1)  # ``group`` resolved (-1: none)

    def __post_init__(self) -> None:
        object.__setattr__(self, "socket_path", parse_address(self.socket_path))
        if self.group is not None:
            try:
                object.__setattr__(self, "group_gid", grp.getgrnam(self.group).gr_gid)
            except KeyError:
                raise InvalidArgumentError(f"--group: no group {self.group!r} on this machine") from None
        for uid in self.admin_uids:
            if type(uid) is not int or not 0 <= uid <= MAX_UID:
                raise InvalidArgumentError(f"--admin-uid: {uid!r} is not a uid (0 .. {MAX_UID})")
        object.__setattr__(self, "admin_uids", tuple(sorted(set(self.admin_uids))))
        seen: set[str] = set()
        for q in self.quotas:
            if q.principal in seen:
                raise InvalidArgumentError(f"--quota: {q.principal} is given more than once; give each principal "
                                           "one quota")
            seen.add(q.principal)
        if self.principal_by not in PRINCIPAL_MODES:
            raise InvalidArgumentError(f"--principal-by must be one of {', '.join(PRINCIPAL_MODES)}, "
                                       f"got {self.principal_by!r}")
        for c in self.admin_cgroups:
            if not isinstance(c, str) or not c.startswith("/") or any(p in (".", "..") for p in c.split("/")) \
                    or "\n" in c or len(c) > 4096:
                raise InvalidArgumentError(f"--admin-cgroup: {c!r} is not an absolute cgroup path (e.g. /user.slice)")
            if not c.strip("/"):
                raise InvalidArgumentError("--admin-cgroup /: every pod is below the root cgroup, so every pod's root "
                                           "would be an admin; name a subtree, e.g. /user.slice")
        if self.admin_cgroups and self.principal_by != "pod":
            raise InvalidArgumentError("--admin-cgroup needs --principal-by pod (in uid mode an admin uid is enough)")
        object.__setattr__(self, "admin_cgroups", tuple(dict.fromkeys(self.admin_cgroups)))
        if not isinstance(self.pages, Config):
            raise InvalidArgumentError(f"pages must be a Config, not {type(self.pages).__name__}")
        if self.host_capacity is not None:
            object.__setattr__(self, "host_capacity", parse_size(self.host_capacity, name="host_capacity"))
        low, high = _EVICT_DEADLINE_RANGE_S
        if not low <= self.evict_deadline_s <= high:
            raise InvalidArgumentError(f"evict deadline must be {low:g} .. {high:g} s, got {self.evict_deadline_s}")
        if not isinstance(self.limits, SessionLimits):
            raise InvalidArgumentError(f"limits must be a SessionLimits, not {type(self.limits).__name__}")
        message = parse_size(self.max_message_bytes, name="max_message_bytes")
        low, high = _MAX_MESSAGE_RANGE
        if not low <= message <= high:
            raise InvalidArgumentError(f"max_message_bytes must be {low} .. {high}, got {message}")
        object.__setattr__(self, "max_message_bytes", message)
        if type(self.max_concurrent_rpcs) is not int or not 1 <= self.max_concurrent_rpcs <= _MAX_CONCURRENT_RPCS:
            raise InvalidArgumentError(f"max_concurrent_rpcs must be 1 .. {_MAX_CONCURRENT_RPCS}, "
                                       f"got {self.max_concurrent_rpcs!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InvalidArgumentError(f"metrics port {self.metrics_port} is not a TCP port")
        if len(self.socket_path.encode()) > _MAX_SOCKET_PATH_BYTES:
            raise InvalidArgumentError(f"socket path {self.socket_path!r} is too long for a Unix socket")

    @property
    def side_channel_path(self) -> str:
        return side_channel_path(self.socket_path)

    @property
    def state_path(self) -> str:
        """What client processes hold, for the next daemon on this socket (state_file.py)."""
        return self.socket_path + ".state"
