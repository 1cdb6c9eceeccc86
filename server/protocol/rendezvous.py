"""Trust at the rendezvous: who owns the socket directory and the sockets, and who the daemon is.

Owns: the checks both ends make before they trust the place they meet: the socket directory
and its ancestors (:func:`check_directory`), a socket file (:func:`check_socket`), the process
behind a connected socket (:func:`check_peer`, ``SO_PEERCRED``; :func:`peer_credentials`), and
which uids a client trusts (:func:`trusted_uids`: root, its own uid, and the uids named in
``$VTALLOC_DAEMON_UIDS`` or by the caller). docs/service.md, "Where the sockets are", says
the same for users.
Invariants: nothing here follows a symbolic link for the directory or a socket (``lstat``);
every refusal is an UntrustedRendezvousError that names what was found (path, owner uid,
mode, peer uid and pid); a client runs every check before it sends a byte or maps a page
(client/session.py). The directory check is what makes the rest hold: in a directory (and
ancestors) only trusted uids can change, nobody else can swap a socket between a check and
the connect that follows it.
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
import struct
from typing import Iterable

from vtalloc.allocator.errors import InvalidArgumentError

from .errors import UntrustedRendezvousError

__all__ = ["DAEMON_UIDS_ENV", "MAX_UID", "trusted_uids", "check_directory", "check_socket", "check_peer",
           "peer_credentials", "parse_uids"]

DAEMON_UIDS_ENV = "VTALLOC_DAEMON_UIDS"
_CRED = struct.Struct("3i")         # struct ucred: pid, uid, gid
MAX_UID = (1 << 32) - 2            # (uid_t)-1 means "no uid" to the kernel
_OPEN_TO_WRITERS = stat.S_IWGRP | stat.S_IWOTH


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel recorded them (at its
    connect, or at the listener's listen)."""
    return _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))


def parse_uids(text: str, *, what: str) -> frozenset[int]:
    """``"1000,vtalloc"``: uids or user names, comma-separated; anything else is an InvalidArgumentError."""
    uids: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.isdigit():
            uid = int(part)
            if uid > MAX_UID:
                raise InvalidArgumentError(f"{what}: uid {part} is out of range (0 .. {MAX_UID})")
        else:
            try:
                uid = pwd.getpwnam(part).pw_uid
            except KeyError:
                raise InvalidArgumentError(f"{what}: {part!r} is neither a uid nor a user name") from None
        uids.add(uid)
    return frozenset(uids)


def trusted_uids(extra: Iterable[int] = ()) -> frozenset[int]:
    """The uids a client lets own its socket directory and run its daemon: root, its own
    effective uid, ``$VTALLOC_DAEMON_UIDS`` and ``extra``."""
    named = parse_uids(os.environ.get(DAEMON_UIDS_ENV, ""), what=f"${DAEMON_UIDS_ENV}")
    return frozenset({0, os.geteuid(), *named, *extra})


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _trusted_text(trusted: frozenset[int]) -> str:
    return "uid " + ", ".join(str(u) for u in sorted(trusted))


def _hint() -> str:
    return (f"; if that daemon is yours, name its uid in ${DAEMON_UIDS_ENV} (uids or user names, "
            "comma-separated)")


def check_directory(path: str, owners: frozenset[int]) -> os.stat_result:
    """Refuse a socket directory that is a symbolic link, not a directory, owned by a uid not in
    ``owners``, or writable by group or others; and one whose ancestors (resolved) are not owned
    by root or ``owners``, or are writable by group or others without the sticky bit (``/tmp``
    is fine: nobody else may rename what is in it). Returns the directory's ``lstat``."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedRendezvousError(
            f"the socket directory {path} is a symbolic link (to {os.readlink(path)!r}), owned by {_who(st.st_uid)}; "
            "a link can point anywhere, so it is not used")
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedRendezvousError(f"the socket directory {path} is not a directory")
    if st.st_uid not in owners:
        raise UntrustedRendezvousError(
            f"the socket directory {path} belongs to {_who(st.st_uid)}, not to a trusted {_trusted_text(owners)}: "
            f"another user may have made it to pose as the vtalloc daemon{_hint()}")
    mode = stat.S_IMODE(st.st_mode)
    if mode & _OPEN_TO_WRITERS:
        raise UntrustedRendezvousError(
            f"the socket directory {path} (owner {_who(st.st_uid)}) has mode {mode:04o}: writable by "
            f"{'group and others' if mode & stat.S_IWGRP and mode & stat.S_IWOTH else 'group' if mode & stat.S_IWGRP else 'others'}"
            ", who could replace the sockets in it")
    ancestor = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    while True:
        ast = os.stat(ancestor)
        amode = stat.S_IMODE(ast.st_mode)
        if ast.st_uid not in owners | {0}:
            raise UntrustedRendezvousError(
                f"{ancestor}, above the socket directory {path}, belongs to {_who(ast.st_uid)}, not to a trusted "
                f"{_trusted_text(owners | {0})}: it could move the socket directory away and put its own{_hint()}")
        if amode & _OPEN_TO_WRITERS and not amode & stat.S_ISVTX:
            raise UntrustedRendezvousError(
                f"{ancestor}, above the socket directory {path}, has mode {amode:04o}: others could move the socket "
                "directory away and put their own (a directory writable by others needs the sticky bit, as /tmp has)")
        parent = os.path.dirname(ancestor)
        if parent == ancestor:
            return st
        ancestor = parent


def check_socket(path: str, owners: frozenset[int]) -> os.stat_result:
    """Refuse a socket path that is not a socket (a link, a file) or is owned by a uid not in ``owners``."""
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a socket"
        raise UntrustedRendezvousError(f"{path} is {kind} (owner {_who(st.st_uid)}, mode {stat.filemode(st.st_mode)})")
    if st.st_uid not in owners:
        raise UntrustedRendezvousError(
            f"the socket {path} belongs to {_who(st.st_uid)}, not to a trusted {_trusted_text(owners)}{_hint()}")
    return st


def check_peer(sock: socket.socket, path: str, trusted: frozenset[int]) -> tuple[int, int, int]:
    """Refuse the process behind a connected socket unless its uid (``SO_PEERCRED``) is trusted."""
    pid, uid, gid = peer_credentials(sock)
    if uid not in trusted:
        raise UntrustedRendezvousError(
            f"the process serving {path} (pid {pid}) runs as {_who(uid)}, not as a trusted "
            f"{_trusted_text(trusted)}: it is not your vtalloc daemon{_hint()}")
    return pid, uid, gid
