"""Where the daemon listens: the default socket path, service addresses, the side channel's path.

Owns: ``default_socket_path()`` (``$VTALLOC_SOCKET``, else ``vtalloc.sock`` in the runtime
directory of allocator/runtime_dir.py, which the daemon and ``vtalloc stats --pid`` share),
``parse_address()`` (only Unix sockets are served) and ``side_channel_path()``.
Invariant: every path returned is absolute, so the daemon and a client agree on it.
"""

from __future__ import annotations

import os

from vtalloc.allocator.errors import InvalidArgumentError
from vtalloc.allocator.runtime_dir import runtime_dir

__all__ = ["SOCKET_NAME", "UNIX_SCHEME", "default_socket_path", "parse_address", "side_channel_path"]

SOCKET_NAME = "vtalloc.sock"
UNIX_SCHEME = "unix://"


def default_socket_path() -> str:
    """``$VTALLOC_SOCKET``, else ``vtalloc.sock`` in the runtime directory."""
    return os.environ.get("VTALLOC_SOCKET") or str(runtime_dir() / SOCKET_NAME)


def parse_address(address: str) -> str:
    """A socket path from ``unix:///abs/path``, ``unix:relative`` or a plain path."""
    if address.startswith(UNIX_SCHEME):
        path = address[len(UNIX_SCHEME):]
    elif address.startswith("unix:"):
        path = address[len("unix:"):]
    elif "://" in address:
        raise InvalidArgumentError(f"service address {address!r}: only unix:// sockets are served")
    else:
        path = address
    if not path:
        raise InvalidArgumentError(f"service address {address!r} names no socket")
    return os.path.abspath(path)


def side_channel_path(control_path: str) -> str:
    """The side channel lives beside the control socket: ``x/vtalloc.sock`` -> ``x/vtalloc.fd.sock``."""
    root, ext = os.path.splitext(control_path)
    return f"{root}.fd{ext or '.sock'}"
