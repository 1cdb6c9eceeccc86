"""Where vtalloc's per-user runtime files live: one directory, shared by the daemon and the publisher.

Owns: :func:`runtime_dir`, the convention (``$VTALLOC_RUNTIME_DIR``, else
``$XDG_RUNTIME_DIR/vtalloc``, else ``/run/vtalloc`` for root, else ``/tmp/vtalloc-<uid>``).
The daemon's default socket (server/protocol/address.py) and the published stats records
(publish.py, ``<runtime>/proc/<pid>.json``) are under it.
Invariants: reading the environment only; nothing here creates or checks the directory (each
user does, with its own rules: the daemon's rendezvous checks, the publisher's private directory).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["runtime_dir"]


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
