"""vtalloc.allocator: the paged virtual address space, in Python.

Layer: above the C ABI (``_native``), below the torch glue (``vtalloc.allocator.torch``),
the service (``vtalloc.server``) and the CLI (``vtalloc.client``). Importing it never
imports torch.

Logging: every module logs under the ``vtalloc`` logger (``vtalloc.allocator``,
``vtalloc.server``, ``vtalloc.client``); the library adds no handler but a NullHandler on
``vtalloc``, so an application turns it up with ``logging.getLogger("vtalloc").setLevel(...)``
and its own handlers (``vtalloc serve`` logs to stderr).
"""

import logging as _logging

if not any(isinstance(h, _logging.NullHandler) for h in _logging.getLogger("vtalloc").handlers):
    _logging.getLogger("vtalloc").addHandler(_logging.NullHandler())

from ._native import global_counters
from .address_space import AddressSpace
from .page_pool import PagePool, PagePoolInfo, PoolInfo
from .config import Config, format_size, parse_size
from .errors import (
    BackendUnavailableError,
    ClosedError,
    DriverError,
    HostPoolExhaustedError,
    InternalError,
    InvalidArgumentError,
    MissingDependencyError,
    NotCopyableError,
    OutOfMemoryError,
    PausedError,
    SourceChangedError,
    VtallocError,
)
from .probe import backend_available, cuda_available
from .stats import AllocationRecord, PageRecord, RegionStats, Stats

__all__ = [
    "AddressSpace", "PagePool", "PagePoolInfo", "PoolInfo", "Config", "Stats", "PageRecord", "AllocationRecord",
    "VtallocError", "OutOfMemoryError", "HostPoolExhaustedError", "InvalidArgumentError", "ClosedError",
    "NotCopyableError", "BackendUnavailableError", "MissingDependencyError", "DriverError", "InternalError", "SourceChangedError",
    "PausedError", "RegionStats", "global_counters", "backend_available", "cuda_available", "parse_size", "format_size",
]
