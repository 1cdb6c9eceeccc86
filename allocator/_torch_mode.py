"""How torch uses vtalloc in this process, and the errors of the torch glue. Never imports torch.

Owns: the process's torch mode (:data:`state`: not at all, ``"global"`` through enable(), or
``"mempool"``; the options in force; the CUDAPluggableAllocator object, kept for the life of
the process; the binding enable() chose) with its lock, and :class:`AllocatorConflictError` / :class:`UnsupportedError`.
Layer: the bottom of the torch glue. ``torch`` (which sets the mode) and ``paged_activations``
(which reads it) both import this module; it imports neither.
Invariant: only ``vtalloc.allocator.torch`` changes :data:`state`, under :data:`lock`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from .config import Config
from .errors import VtallocError

__all__ = ["AllocatorConflictError", "UnsupportedError", "State", "state", "lock", "GLOBAL", "MEMPOOL"]

GLOBAL, MEMPOOL = "global", "mempool"  # the modes; None: torch does not use vtalloc


class AllocatorConflictError(VtallocError, RuntimeError):
    """torch's allocator is already set up in a way this call cannot change (nothing was changed)."""


class UnsupportedError(VtallocError, NotImplementedError):
    """A torch feature that cannot work with vtalloc as torch's allocator; the message says why."""


@dataclasses.dataclass
class State:
    mode: str | None = None            # None, GLOBAL (enable) or MEMPOOL
    config: Config | None = None
    allocator: Any = None              # torch.cuda.memory.CUDAPluggableAllocator, never released
    original_record_stream: Any = None
    binding: Any = None                # _torch_install.Binding once enable() chose one


state = State()
lock = threading.RLock()
