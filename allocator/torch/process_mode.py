"""How torch uses vtalloc in this process, and the errors of the torch glue. Never imports torch at import.

Owns: the process's torch mode (:data:`state`: not at all, ``"global"`` through enable(), or
``"mempool"``; the options in force; the CUDAPluggableAllocator object, kept for the life of
the process; the binding enable() chose) with its lock, :class:`AllocatorConflictError` /
:class:`UnsupportedError`, the one deferred ``import torch`` (:func:`import_torch`) and how the
options in force are written in messages (:func:`describe`).
Layer: the bottom of the torch glue. ``enabling`` (which sets the mode), ``memory``,
``offloading`` and ``activation_paging`` (which read it) import this module; it imports none of them.
Invariant: only ``enabling`` changes :data:`state`, under :data:`lock`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from .. import extras
from ..config import Config, format_size
from ..errors import VtallocError

__all__ = ["AllocatorConflictError", "UnsupportedError", "State", "state", "lock", "GLOBAL", "MEMPOOL",
           "import_torch", "describe"]

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


def import_torch() -> Any:
    """torch, imported now (deferred on purpose: importing vtalloc.allocator must not import torch);
    MissingDependencyError naming the extra when it is not installed."""
    return extras.import_torch()



def describe(cfg: Config | None) -> str:
    if cfg is None:
        return "none"
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("backend", "device")}
    return ", ".join(f"{k}={format_size(v) if isinstance(v, int) else v}" for k, v in fields.items() if v is not None) or "defaults"

