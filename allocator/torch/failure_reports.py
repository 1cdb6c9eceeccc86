"""What the torch allocator could not do, and how an out-of-memory under enable() reaches Python.

Owns: ``failures`` (a device's counts of refused allocations, out-of-memories, capture refusals,
failed and parked frees, and the last message: the shim's failure records), ``oom_exception``
(which Python exception an out-of-memory becomes in this process) and ``oom_binding`` (how it
is bound to ``c10::OutOfMemoryError``, or why not), docs/torch.md "An out-of-memory error
under enable()".
Invariants: reading changes nothing; only ``oom_exception`` imports torch (to bind against
the torch this process uses, as enable() does); every function works before enable().
"""

from __future__ import annotations

from typing import Any

from . import shim as _torch_shim
from . import stat_keys as _stats
from .process_mode import import_torch as _torch
from .shim import Failures, OomBinding

__all__ = ["failures", "oom_exception", "oom_binding", "Failures", "OomBinding"]


def failures(device: Any = 0) -> Failures:
    """What the allocator could not do on ``device``: counts and the last message (OOM numbers included)."""
    return _torch_shim.failures(_stats.device_index(device))


def oom_exception() -> str:
    """Which Python exception an out-of-memory under enable() becomes in this process.

    "torch.OutOfMemoryError" when vtalloc could bind to the torch it runs with, else
    "RuntimeError" (the fallback, with the same message). Imports torch first, as enable()
    does; :func:`oom_binding` says how it bound, or why not.
    """
    _torch()  # bind against the torch this process uses
    return oom_binding().exception


def oom_binding() -> OomBinding:
    """How an out-of-memory under enable() is bound to ``c10::OutOfMemoryError`` in this process
    now: the route ("constructor" or "base+vtable"), torch's std::string ABI, the torch libraries
    the symbols came from, or why it is not (then the exception is RuntimeError).

    Unlike :func:`oom_exception` it does not import torch: it reports the process as it is.
    """
    return _torch_shim.oom_binding()
