"""The C++ core's shared library (``_vtalloc*.so``), found and loaded once per process.

Owns: :func:`library_path` (``$VTALLOC_LIBRARY``, else the library built into this package),
:func:`load_library` (one ``ctypes.CDLL`` for the process, its ABI version checked),
:func:`load_with` (that library with a module's prototype table declared on it, once per table:
``_native``'s for vtalloc.h, ``backends``' for the registry) and ``ABI_VERSION``.
Invariant: the library is loaded at most once, under a lock; a library whose ABI version
differs from ``ABI_VERSION`` is refused and never handed out.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path

from . import _cabi
from .errors import InternalError

__all__ = ["ABI_VERSION", "library_path", "load_library", "load_with"]

ABI_VERSION = 3

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()
_declared: set[int] = set()  # id() of each prototype table declared on _lib


def library_path() -> str:
    """Path of the shared library: $VTALLOC_LIBRARY, else the one built into this package."""
    override = os.environ.get("VTALLOC_LIBRARY")
    if override:
        return override
    here = Path(__file__).resolve().parent
    found = sorted(glob.glob(str(here / "_vtalloc*.so")))
    if not found:
        raise InternalError(
            f"vtalloc's native library is missing from {here}: reinstall with `pip install .` (it needs a C++ compiler)"
        )
    return found[0]


def load_library() -> ctypes.CDLL:
    """The process's one handle on the library, loaded (and its ABI version checked) on first use."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(library_path())
            abi = lib.vta_abi_version
            abi.restype, abi.argtypes = ctypes.c_int32, []
            version = abi()
            if version != ABI_VERSION:
                raise InternalError(f"native library ABI {version} does not match the Python package's {ABI_VERSION}")
            _lib = lib
    return _lib


def load_with(prototypes: _cabi.Prototypes) -> ctypes.CDLL:
    """The library, with ``prototypes`` (a module-level table: it lives as long as the process)
    declared on it the first time that table is asked for."""
    lib = load_library()
    if id(prototypes) not in _declared:
        with _lock:
            _cabi.declare(lib, prototypes)
            _declared.add(id(prototypes))
    return lib
