"""Who a client is, in a container: its cgroup v2 path and, under the kubelet's layouts, its pod.

Owns: ``vtalloc serve --principal-by`` (:data:`PRINCIPAL_MODES`), the parsing of a
``/proc/<pid>/cgroup`` text into the cgroup v2 path and of that path into a Kubernetes pod UID
(:func:`pod_from_cgroup`), and the reading of a peer's cgroup once, at connection time, bound
to the process that connected (:func:`peer_cgroup`, Note [Reading a peer's cgroup]).
docs/kubernetes.md says the same for operators.

Invariants: the kernel writes ``/proc/<pid>/cgroup``, but names below a delegated cgroup are the
peer's to choose, so a pod UID is taken only from a path that is the kubelet's from its first
component (Note [Anchored pod paths]); anything else is "no pod", never a guess. A peer whose
cgroup cannot be read, or whose process may have changed under the read, is refused
(:class:`PeerIdentityError`): in pod mode the daemon never falls back to a weaker identity for
a peer it could not see. Nothing here blocks on a peer: procfs reads only, bounded in size.

Note [Anchored pod paths]
-------------------------
The kubelet makes one cgroup per pod: with the systemd driver
``/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid, '-' as '_'>.slice/<container>.scope``
(Guaranteed pods: ``/kubepods.slice/kubepods-pod<uid>.slice/...``), with the cgroupfs driver
``/kubepods/<qos>/pod<uid>/<container id>`` (Guaranteed: ``/kubepods/pod<uid>/...``). A process
that may create cgroups (a systemd user manager delegates ``user@<uid>.service`` to its user;
a container with a writable cgroupfs its own subtree) can name one ``kubepods-burstable-pod<X>.slice``
and move itself there. So the pod is read only from the kubelet's chain *starting at the first
component*: an absolute path must begin with ``kubepods.slice`` or ``kubepods``; a path relative
to the daemon's own cgroup namespace (``/../../kubepods-burstable-pod<X>.slice/...``: a daemon in
a container sees other containers' cgroups from its own) may begin anywhere in the chain above
the container, since the component after the ``..``s names a child of one of the daemon's own
ancestors, which only who can write above the daemon's cgroup (root on the host) can create.
Below the pod's cgroup anything goes (a container's own subcgroups are still its pod).

Note [Reading a peer's cgroup]
------------------------------
``SO_PEERCRED`` gives the pid of the process that connected; by the time the daemon reads
``/proc/<pid>/cgroup`` that process may have exited and the pid been given to another one.
The daemon holds a pidfd for the connecting process (``SO_PEERPIDFD``, Linux >= 6.5, names
exactly that process; older kernels: ``pidfd_open(pid)`` and a start-time check, the process
must have started before the connection was accepted), reads the file once, and then checks
that the pidfd's process has not exited: while it lives, its pid cannot name another process,
so what was read is its cgroup. Any doubt refuses the connection. The cgroup read then is the
session's for its lifetime: a process that moves to another cgroup later (which needs write
access to the common ancestor's ``cgroup.procs``: no unprivileged container has it outside
its own subtree) keeps the principal it connected with.
"""

from __future__ import annotations

import os
import re
import select
import time
from dataclasses import dataclass

__all__ = ["PRINCIPAL_MODES", "POD_UID_RE", "PeerIdentity", "PeerIdentityError", "cgroup_v2_path", "pod_from_cgroup",
           "peer_cgroup", "own_cgroup", "under_cgroup", "limit_key", "pidfd_exited",
           "boot_ticks_now"]

PRINCIPAL_MODES = ("uid", "pod")
_MAX_CGROUP_FILE_BYTES = 64 << 10   # one line per hierarchy, each at most PATH_MAX
_QOS = ("burstable", "besteffort")
# A pod UID: a UUID (API-server pods) or 32 hex digits (static pods: a hash).
# The systemd driver writes the UUID's dashes as underscores (a dash separates slice levels).
_UUID = r"[0-9a-f]{8}{0}[0-9a-f]{4}{0}[0-9a-f]{4}{0}[0-9a-f]{4}{0}[0-9a-f]{12}"
POD_UID_RE = "(?:" + _UUID.replace("{0}", "-") + "|[0-9a-f]{32})"
_SYSTEMD_UID = "(?:" + _UUID.replace("{0}", "_") + "|[0-9a-f]{32})"
_SYSTEMD_POD = re.compile(rf"kubepods(?:-(burstable|besteffort))?-pod({_SYSTEMD_UID})\.slice")  # fullmatch
_CGROUPFS_POD = re.compile(rf"pod({POD_UID_RE})")  # fullmatch


class PeerIdentityError(PermissionError):
    """The daemon could not tell, safely, which cgroup a peer is in."""


@dataclass(frozen=True)
class PeerIdentity:
    cgroup: str          # the cgroup v2 path as the daemon sees it ("" in uid mode)
    pod: str | None      # the pod UID (dashes), when the path is a kubelet pod's


def limit_key(uid: int, pod: str | None) -> int | str:
    """Whom a connection's per-caller limits count against (limits.py): its pod when it has
    one (``pod:<uid>``), else its uid."""
    return f"pod:{pod}" if pod else uid


def cgroup_v2_path(text: str) -> str | None:
    """The cgroup v2 path from a ``/proc/<pid>/cgroup`` text (its ``0::`` line), or None."""
    for line in text.splitlines():
        if line.startswith("0::"):
            path = line[3:]
            return path if path.startswith("/") else None
    return None


def _systemd_chain(parts: list[str], relative: bool) -> str | None:
    i = 0
    if parts[:1] == ["kubepods.slice"]:
        i = 1
    elif not relative:
        return None
    qos = None
    if i < len(parts) and parts[i] in [f"kubepods-{q}.slice" for q in _QOS]:
        qos = parts[i][len("kubepods-"):-len(".slice")]
        i += 1
    m = _SYSTEMD_POD.fullmatch(parts[i]) if i < len(parts) else None
    if m is None:
        return None
    if m.group(1) != qos and not (relative and i == 0):
        return None  # a pod slice in a QoS slice not its own is not the kubelet's
    return m.group(2)


def _cgroupfs_chain(parts: list[str], relative: bool) -> str | None:
    i = 0
    if parts and parts[0] == "kubepods":
        i = 1
    elif not relative:
        return None
    if i < len(parts) and parts[i] in _QOS:
        i += 1
    if i >= len(parts):
        return None
    m = _CGROUPFS_POD.fullmatch(parts[i])
    return m.group(1) if m else None


def pod_from_cgroup(path: str) -> str | None:
    """The Kubernetes pod UID (lower-case, with dashes) of a cgroup v2 path in one of the kubelet's
    layouts, or None (Note [Anchored pod paths])."""
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    parts = path.split("/")[1:]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    parts = parts[ups:]
    if any(p in ("", ".", "..") for p in parts):
        return None  # the kernel writes neither; do not guess
    relative = ups > 0
    uid = _systemd_chain(parts, relative) or _cgroupfs_chain(parts, relative)
    if uid is None:
        return None
    return uid.replace("_", "-")


def under_cgroup(path: str, prefix: str) -> bool:
    """Whether cgroup ``path`` is ``prefix`` or below it, component by component. A path outside
    the reader's cgroup namespace (``/../...``) is below no prefix."""
    if not path.startswith("/") or not prefix.startswith("/"):
        return False
    parts = [p for p in path.split("/") if p]
    if ".." in parts:
        return False
    want = [p for p in prefix.split("/") if p]
    return parts[:len(want)] == want


def _read_cgroup_file(pid: int) -> str:
    fd = os.open(f"/proc/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        chunks, size = [], 0
        while size < _MAX_CGROUP_FILE_BYTES:
            b = os.read(fd, _MAX_CGROUP_FILE_BYTES - size)
            if not b:
                break
            chunks.append(b)
            size += len(b)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


def _exited(pidfd: int) -> bool:
    """Whether the process a pidfd names has exited (a pidfd polls readable then; poll, not
    select: descriptors may be above 1023)."""
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(0))


pidfd_exited = _exited


def boot_ticks_now() -> int:
    """Now, in the clock ticks since boot that ``/proc/<pid>/stat`` gives start times in (rounded up)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK")) + 1


def own_cgroup() -> str:
    """The daemon's own cgroup v2 path, as it sees it ("" if it has none)."""
    try:
        return cgroup_v2_path(_read_cgroup_file(os.getpid())) or ""
    except OSError:
        return ""


def peer_cgroup(pid: int, pidfd: int | None, *, exact_pidfd: bool, accepted_ticks: int | None = None,
                start_ticks: int | None = None) -> PeerIdentity:
    """The cgroup (and pod) of the process that connected (Note [Reading a peer's cgroup]).

    ``pidfd``: a pidfd for it; ``exact_pidfd``: it came from ``SO_PEERPIDFD`` (else from
    ``pidfd_open(pid)``, and ``start_ticks`` of the process must be at most ``accepted_ticks``,
    both clock ticks since boot). Raises PeerIdentityError when the answer could be wrong."""
    if pid <= 0:
        raise PeerIdentityError("the client's pid is not visible to the daemon (another pid namespace: run the "
                                "daemon in the host's, e.g. hostPID: true)")
    if pidfd is None:
        raise PeerIdentityError(f"no pidfd for pid {pid}: the process is gone, or the kernel lacks pidfd_open")
    if not exact_pidfd and (start_ticks is None or accepted_ticks is None or start_ticks > accepted_ticks):
        raise PeerIdentityError(f"pid {pid} may have been reused since it connected")
    try:
        text = _read_cgroup_file(pid)
    except OSError as e:
        raise PeerIdentityError(f"cannot read /proc/{pid}/cgroup: {e.strerror or e}") from None
    if _exited(pidfd):
        raise PeerIdentityError(f"pid {pid} exited while its cgroup was read")
    path = cgroup_v2_path(text)
    if path is None:
        raise PeerIdentityError(f"pid {pid} has no cgroup v2 path (a cgroup v1-only host?)")
    return PeerIdentity(path, pod_from_cgroup(path))
