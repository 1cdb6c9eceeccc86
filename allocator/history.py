"""A space's allocation history in PyTorch's trace format, for the memory_viz timeline.

Owns: :class:`History`, what ``AddressSpace.record_history()`` turns on: a bounded list of trace
entries ("alloc", "free_requested", "free_completed", "oom") with the Python stack of each call,
and the stack of every live allocation made while recording (the snapshot's blocks show it).
``AddressSpace.memory_snapshot()`` puts them in ``device_traces`` and the blocks' ``frames``, as
``torch.cuda.memory._snapshot()`` does after ``torch.cuda.memory._record_memory_history()``.
Invariants: imports nothing of torch; an entry is a dict with the keys torch's snapshot gives
(action, addr, size, stream, time_us, frames, compile_context, user_metadata; device_free in place
of addr for an oom); frames are {"filename", "line", "name"}, innermost first, without vtalloc's
own frames; at most ``max_entries`` are kept, the oldest going first; thread-safe.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["History", "DEFAULT_MAX_ENTRIES"]

DEFAULT_MAX_ENTRIES = 100_000  # torch's own default for _record_memory_history(max_entries=...)
_MAX_FRAMES = 64
_PACKAGE = os.path.dirname(os.path.abspath(__file__))  # vtalloc/allocator: its frames are not the caller's


def _frames(skip_package: bool = True) -> list[dict[str, Any]]:
    """The calling Python stack, innermost first, as torch's snapshot writes frames."""
    out: list[dict[str, Any]] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and len(out) < _MAX_FRAMES:
        code = frame.f_code
        if not (skip_package and os.path.abspath(code.co_filename).startswith(_PACKAGE + os.sep)):
            out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out


class History:
    """One space's recorded allocations and frees (``max_entries`` at most; ``stacks``: with frames)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, stacks: bool = True) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise InvalidArgumentError(f"max_entries must be a positive integer, got {max_entries!r}")
        self.max_entries = max_entries
        self.stacks = bool(stacks)
        self._lock = threading.Lock()
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_entries)
        self._live: dict[int, tuple[int, int, list[dict[str, Any]]]] = {}  # address -> (size, stream, frames)

    def _entry(self, action: str, addr: int, size: int, stream: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
        return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time.time_ns() // 1000,
                "frames": frames, "compile_context": "N/A", "user_metadata": ""}

    def alloc(self, address: int, size: int, stream: int) -> None:
        frames = _frames() if self.stacks else []
        with self._lock:
            self._live[address] = (size, stream, frames)
            self._entries.append(self._entry("alloc", address, size, stream, frames))

    def free(self, address: int, size: int | None = None) -> None:
        """A free, requested and completed at once (the space hands the block back at once).
        ``size`` for an allocation made before recording began (else the recorded one)."""
        frames = _frames() if self.stacks else []
        with self._lock:
            known = self._live.pop(address, None)
            n, stream = (known[0], known[1]) if known else (size or 0, 0)
            for action in ("free_requested", "free_completed"):
                self._entries.append(self._entry(action, address, n, stream, frames))

    def oom(self, requested: int, device_free: int, stream: int = 0) -> None:
        frames = _frames() if self.stacks else []
        with self._lock:
            entry = self._entry("oom", 0, requested, stream, frames)
            del entry["addr"]
            entry["device_free"] = device_free
            self._entries.append(entry)

    def trace(self) -> list[dict[str, Any]]:
        """The entries, oldest first (copies: the caller may keep or change them)."""
        with self._lock:
            return [dict(e) for e in self._entries]

    def frames_of(self, address: int) -> list[dict[str, Any]]:
        """Where the live allocation at ``address`` was made ([] if before recording began)."""
        with self._lock:
            known = self._live.get(address)
        return list(known[2]) if known else []

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
