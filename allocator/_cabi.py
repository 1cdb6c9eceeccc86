"""The C ABI edge, Python side: declaring prototypes on the library and reading a failure back.

Owns: :func:`declare` (a table ``name -> (restype, argtypes)`` set on a loaded ``ctypes.CDLL``)
and :func:`check` (a non-zero status becomes the matching vtalloc exception), shared by
``_native`` (vtalloc.h) and ``torch.shim`` (torch_shim.h), and the status codes they name.
Invariants: the whole C ABI keeps one last error per thread (csrc/capi/guard.hpp), so a
failure of any entry point is read back with ``vta_last_error`` and, for an out-of-memory,
``vta_last_oom``, on the thread that made the call; the library passed to :func:`check` is
the one ``_native.load()`` returned, which declared both.
"""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Sequence

from .errors import Status, error_for_status

__all__ = ["declare", "check"]

Prototypes = Mapping[str, "tuple[Any, Sequence[Any]]"]


def declare(lib: ctypes.CDLL, prototypes: Prototypes) -> None:
    """Set the result and argument types of every function in ``prototypes`` on ``lib``."""
    for name, (restype, argtypes) in prototypes.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def check(lib: ctypes.CDLL, status: int) -> None:
    """Raise the exception for a non-zero status returned by ``lib`` on this thread."""
    if status == Status.OK:
        return
    message = (lib.vta_last_error() or b"").decode("utf-8", "replace")
    oom = None
    if status == Status.OUT_OF_MEMORY:
        requested, capacity, mapped = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        lib.vta_last_oom(ctypes.byref(requested), ctypes.byref(capacity), ctypes.byref(mapped))
        oom = (requested.value, capacity.value, mapped.value)
    raise error_for_status(status, message, oom)
