"""Regions under enable(): torch's CUDA tensors made under a tag, paused and resumed together.

Owns: ``region(tag)`` (this thread's torch allocations carry ``tag``: tensors, and the blocks of
CUDA graph-private pools captured inside), ``pause(tag, discard=...)``, ``resume(tag,
timeout=...)`` and ``regions(device)``, over the shim's per-device spaces (docs/regions.md; the
RL colocation recipe is in docs/torch.md). The tag in force lives in the core, per thread, so the
torch bindings read it with no call into Python.
Invariants: never imports torch; the shim must be configured (``enable()``, or a test's
``shim.configure``), else InvalidArgumentError; a ``region()`` block restores the tag before it
however it ends; a resume's rule (what it takes, how long it waits, all or nothing per device) is
the address space's (allocator/regions.py).
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Iterator

from .. import _native
from ..errors import InvalidArgumentError
from ..regions import region_rows, resume_with_retries, tag_id
from ..stats import RegionStats
from . import shim as _shim

__all__ = ["region", "pause", "resume", "regions"]


def _configured() -> None:
    if not _shim.current_config()[0]:
        raise InvalidArgumentError("regions of torch's tensors need vtalloc as torch's allocator: call "
                                   "vtalloc.allocator.torch.enable() first")


def _device_arg(device: int | None) -> int:
    _shim.check_device(device, every=True)
    return _shim.ALL_DEVICES if device is None else device


@contextlib.contextmanager
def region(tag: str) -> Iterator[str]:
    """``with vt.region("weights"): model = Model().cuda()``: the CUDA tensors this thread allocates
    inside the block (and the graph-private pools of CUDA graphs it captures there) carry ``tag``.
    Per thread, as torch.cuda.use_mem_pool: autograd's backward thread is not inside it."""
    _configured()
    lib = _shim.lib()
    previous = ctypes.c_uint32()
    _shim.check(lib.vta_torch_set_region(tag_id(tag), ctypes.byref(previous)))
    try:
        yield tag
    finally:
        _shim.check(lib.vta_torch_set_region(previous.value, None))


def pause(tag: str, *, discard: bool = False, device: int | None = None) -> int:
    """Pause the region on ``device`` (None: every device): its tensors keep their addresses (and a
    captured CUDA graph over them stays valid) while their device memory is released, their bytes
    kept in pinned host memory (``discard=True``: not kept; a KV cache). Do not touch them (no
    kernel, no copy, no replay of a graph that reads them) until :func:`resume`. Returns the device
    page bytes released. Synchronous: it waits for the work queued on the tensors' streams."""
    _configured()
    out = ctypes.c_uint64()
    flags = _native.PAUSE_DISCARD if discard else 0
    _shim.check(_shim.lib().vta_torch_region_pause(_device_arg(device), tag_id(tag), flags, ctypes.byref(out)))
    return out.value


def resume(tag: str, *, timeout: float = 0.0, device: int | None = None) -> int:
    """Bring the region back at the same addresses (one device at a time; each all or nothing):
    device memory is taken as an allocation takes it (free and cached pages, then evicting tensors
    marked evictable), retried until ``timeout`` seconds passed, then OutOfMemoryError with the
    region still paused. Returns the device page bytes mapped."""
    _configured()
    region_id, dev = tag_id(tag), _device_arg(device)

    def attempt(counted: bool) -> int:
        out = ctypes.c_uint64()
        flags = 0 if counted else _native.RESTORE_TRY
        _shim.check(_shim.lib().vta_torch_region_resume(dev, region_id, flags, ctypes.byref(out)))
        return out.value

    return resume_with_retries(tag, timeout, attempt)


def regions(device: int = 0) -> list[RegionStats]:
    """One record per region of ``device``'s space (none before its first allocation)."""
    _shim.check_device(device)
    lib = _shim.lib()
    return region_rows(lambda rows, n, count: lib.vta_torch_regions(device, rows, n, count), _shim.check)
