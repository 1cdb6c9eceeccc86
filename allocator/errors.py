"""vtalloc's one exception hierarchy, and the only place C status codes become exceptions.

Every error raised by vtalloc is a :class:`VtallocError`; each subclass also derives from
the built-in exception a user would catch without knowing vtalloc: an out-of-memory is a
``MemoryError``, a bad argument is a ``ValueError``.
"""

from __future__ import annotations

import enum

__all__ = [
    "VtallocError",
    "OutOfMemoryError",
    "HostPoolExhaustedError",
    "InvalidArgumentError",
    "SourceChangedError",
    "ClosedError",
    "PausedError",
    "NotCopyableError",
    "BackendUnavailableError",
    "MissingDependencyError",
    "DriverError",
    "InternalError",
]


class VtallocError(Exception):
    """Base class of every error vtalloc raises."""


class OutOfMemoryError(VtallocError, MemoryError):
    """Capacity is exhausted even after reclaiming cached pages (and evicting, where allowed).

    Attributes carry the numbers: ``requested_bytes``, ``capacity_bytes``, ``mapped_bytes``.
    """

    def __init__(self, message: str, requested_bytes: int = 0, capacity_bytes: int = 0, mapped_bytes: int = 0):
        super().__init__(message)
        self.requested_bytes = requested_bytes
        self.capacity_bytes = capacity_bytes
        self.mapped_bytes = mapped_bytes


class HostPoolExhaustedError(VtallocError, MemoryError):
    """The pinned host pool cannot hold another evicted page (raise ``host_capacity``)."""


class InvalidArgumentError(VtallocError, ValueError):
    """A size, address or option is invalid: nothing was changed."""


class SourceChangedError(VtallocError, RuntimeError):
    """A saved activation planned for recompute reads a tensor (a parameter) that changed in place
    between forward and backward: the value cannot be recomputed exactly, so it is refused."""


class ClosedError(VtallocError, RuntimeError):
    """The address space (or client) was closed."""


class PausedError(VtallocError, RuntimeError):
    """The allocation belongs to a paused region (docs/regions.md): its pages are off the device and
    its address unmapped, so it may not be read, written, restored or offloaded until the region is
    resumed. Nothing was changed."""


class NotCopyableError(VtallocError, TypeError):
    """The object owns a native handle (an address space, a page pool, a service session), so it
    cannot be copied, deep-copied or pickled: two Python owners of one handle would both close it.
    Build a new one instead."""


class BackendUnavailableError(VtallocError, RuntimeError):
    """The requested backend cannot run here (no CUDA driver, no such device, ...)."""


class MissingDependencyError(VtallocError, ImportError):
    """An optional dependency (torch, cuda-python) is not installed; the message names the extra
    or the command that installs it (``pip install 'vtalloc[torch]'``)."""


class DriverError(VtallocError, RuntimeError):
    """The CUDA driver (or the OS, for the host backend) reported an error."""


class InternalError(VtallocError, RuntimeError):
    """An internal invariant did not hold: a vtalloc bug. Please report it."""


# Status codes of csrc/include/vtalloc/vtalloc.h.
class Status(enum.IntEnum):
    """vta_status_t of vtalloc.h (tests/test_errors.py checks the two agree)."""

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_MEMORY = 2
    BACKEND_UNAVAILABLE = 3
    DRIVER = 4
    CLOSED = 5
    HOST_POOL_EXHAUSTED = 6
    INTERNAL = 7
    PAUSED = 8


_BY_STATUS: dict[int, type[VtallocError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.BACKEND_UNAVAILABLE: BackendUnavailableError,
    Status.DRIVER: DriverError,
    Status.CLOSED: ClosedError,
    Status.HOST_POOL_EXHAUSTED: HostPoolExhaustedError,
    Status.INTERNAL: InternalError,
    Status.PAUSED: PausedError,
}


def error_for_status(status: int, message: str, oom: tuple[int, int, int] | None = None) -> VtallocError:
    """Build the exception for a non-zero vta_status_t."""
    cls = _BY_STATUS.get(status, InternalError)
    if cls is OutOfMemoryError:
        requested, capacity, mapped = oom or (0, 0, 0)
        return OutOfMemoryError(message, requested, capacity, mapped)
    if cls is InternalError and status not in _BY_STATUS:
        message = f"unknown vtalloc status {status}: {message}"
    return cls(message)
