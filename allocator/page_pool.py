"""PagePool: the page pool, physical pages created to be leased to other processes (the service's side).

Owns: one native ``vta_pool`` handle (the C ABI keeps the ``vta_pool_*`` names; in prose and
Python names it is the page pool, docs/design.md "Glossary"). Pages are never mapped in this process; each export
returns a fresh file descriptor that the caller owns (send it with SCM_RIGHTS, then close
it). Page ids are never reused within a pool. ``close()`` releases every page; a page a
client has imported stays alive in that client until the client releases it (driver and
kernel reference counting), so closing the pool revokes nothing already handed out. Not
copyable or picklable (NotCopyableError); a forked child can neither use nor close it (_handle.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from . import _native, backends
from ._handle import NativeHandle
from .checks import as_u64
from .config import Config
from .errors import ClosedError

__all__ = ["PagePool", "PagePoolInfo", "PoolInfo"]


@dataclass(frozen=True)
class PagePoolInfo:
    backend: str
    device: int
    page_bytes: int
    capacity_bytes: int
    pages_held: int
    exportable: bool


class PagePool(NativeHandle):
    _CLOSE_FN, _DESTROY_FN = "vta_pool_close", "vta_pool_destroy"

    def __init__(self, backend: str = "auto", device: int = 0, capacity: int | str | None = None,
                 page_size: int | str | None = None, *, host_granularity: int | str | None = None,
                 config: Config | None = None) -> None:
        self._handle = None
        config = config or Config(backend=backend, device=device, capacity=capacity, page_size=page_size,
                                  host_granularity=host_granularity)
        self._lib = _native.load()
        c = _native.make_config(config)
        handle = ctypes.c_void_p()
        _native.check(self._lib.vta_pool_create(ctypes.byref(c), ctypes.byref(handle)))
        self._own(handle.value)
        self._closed = False
        info = self.info()
        self.backend, self.device = info.backend, info.device
        self.page_bytes, self.capacity_bytes = info.page_bytes, info.capacity_bytes

    def _h(self) -> int:
        if self._forked():
            raise ClosedError(f"this page pool belongs to process {self._owner_pid}, which forked this one; "
                              "create a new one after fork")
        if self._handle is None or self._closed:
            raise ClosedError("the page pool is closed")
        return self._handle

    def info(self) -> PagePoolInfo:
        raw = _native.VtaPoolInfo()
        _native.check(self._lib.vta_pool_info(self._h(), ctypes.byref(raw)))
        return PagePoolInfo(backends.name_of(raw.backend), raw.device, raw.page_bytes, raw.capacity_bytes,
                        raw.pages_held, bool(raw.exportable))

    def create_page(self) -> int:
        """A new page's id; OutOfMemoryError at capacity."""
        out = ctypes.c_uint64()
        _native.check(self._lib.vta_pool_create_page(self._h(), ctypes.byref(out)))
        return out.value

    def export_page(self, page_id: int) -> int:
        """A new file descriptor for the page (the caller closes it)."""
        out = ctypes.c_int32()
        _native.check(self._lib.vta_pool_export_page(self._h(), as_u64(page_id, "page_id"), ctypes.byref(out)))
        return out.value

    def release_page(self, page_id: int) -> None:
        _native.check(self._lib.vta_pool_release_page(self._h(), as_u64(page_id, "page_id")))

    def close(self) -> None:
        if self._handle is None or self._closed:
            return
        self._closed = True
        if self._forked():  # the pages are the parent's: a child forgets the handle, releases nothing
            self._handle = None
            return
        _native.check(self._lib.vta_pool_close(self._handle))


PoolInfo = PagePoolInfo  # the name before the glossary's "page pool": kept for old imports
