"""Where vtalloc's per-user runtime files live: one directory, shared by the daemon and the publisher.

Owns: :func:`runtime_dir`, the convention (``$VTALLOC_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/vtalloc``, else ``/run/vtalloc`` for root, else ``/tmp/vtalloc-<uid>``),
and :func:`open_checked_dir`, how a file under it is reached safely: through a held descriptor
of a directory whose owner and mode were checked on that very descriptor (Note [Held
directory descriptors]). The daemon's default socket (server/protocol/address.py) and the
published stats records (publish.py, ``<runtime>/proc/<pid>.json``) are under it.
Invariants: reading the environment and opening directories only; nothing here creates a file;
a directory is checked by ``fstat`` of the descriptor then used (never its path again), its
last component opened with ``O_NOFOLLOW``; a directory that group or others may write, or
that an unexpected uid owns, is refused (InvalidArgumentError naming owner and mode).

Note [Held directory descriptors]
---------------------------------
``/tmp/vtalloc-<uid>`` can be made by anyone first. Checking a path's owner and then opening
a name under that path lets whoever controls a directory on the way swap it between the check
and the open (``rename`` exchange), and an ``open`` that follows links then writes wherever a
planted link points (issue 38: another user's file replaced by a stats record). So every file
vtalloc keeps in a directory another user might control is reached as: open the directory
(``O_DIRECTORY | O_NOFOLLOW``), check *that descriptor* (owner, mode, that it is a directory),
then open, create, rename and remove names relative to it (``dir_fd``), each with
``O_NOFOLLOW`` (and ``O_EXCL`` to create). A swap of the path after the check changes nothing:
the descriptor still names the checked directory, and nobody else can add a name to it.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable

from .errors import InvalidArgumentError

__all__ = ["runtime_dir", "open_checked_dir", "DIR_FLAGS"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def runtime_dir() -> Path:
    """``$VTALLOC_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/vtalloc``, else ``/run/vtalloc`` for root,
    else ``/tmp/vtalloc-<uid>``."""
    explicit = os.environ.get("VTALLOC_RUNTIME_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "vtalloc"
    if os.geteuid() == 0:
        return Path("/run/vtalloc")
    return Path(tempfile.gettempdir()) / f"vtalloc-{os.geteuid()}"


def open_checked_dir(path: str | os.PathLike, *, owners: Iterable[int], dir_fd: int | None = None,
                     create_mode: int | None = None) -> int:
    """A descriptor (the caller closes it) of directory ``path`` (relative to ``dir_fd`` if given),
    checked on the descriptor: a directory, owned by one of ``owners``, writable by neither group
    nor others. With ``create_mode`` it is created first if missing (``mkdir``, that mode).
    Its last component is never followed; InvalidArgumentError says what was found."""
    if create_mode is not None:
        try:
            os.mkdir(path, create_mode, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a symbolic link, a file
            raise InvalidArgumentError(f"{path} is not a directory (a symbolic link or a file): not used") from None
        raise
    try:
        st = os.fstat(fd)
        allowed = frozenset(owners)
        if st.st_uid not in allowed:
            raise InvalidArgumentError(
                f"{path} belongs to uid {st.st_uid}, not to uid {' or '.join(map(str, sorted(allowed)))}: another "
                "user may have made it; not used")
        mode = stat.S_IMODE(st.st_mode)
        if mode & _WRITABLE_BY_OTHERS:
            raise InvalidArgumentError(f"{path} has mode {mode:04o}: others may write in it; not used")
    except BaseException:
        os.close(fd)
        raise
    return fd
