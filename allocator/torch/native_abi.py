"""ctypes face of the torch-native C ABI (csrc/include/vtalloc/torch_native.h). Never imports torch.

Owns: the structs of torch_native.h mirrored field by field, the prototypes of its functions,
and typed wrappers that return frozen dataclasses (:class:`PoolId`, :class:`Block`,
:class:`DeviceStats`): what the torch-native binding's Python side and the tests share.

Invariants: every argument is checked before it crosses into C (a bad one is an
InvalidArgumentError); a non-zero status raises the exception of allocator/errors.py with the
core's message; the spaces are the pluggable shim's (``shim``), configured there.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

from .. import _cabi
from . import shim as _torch_shim
from ..checks import as_u64
from ..errors import InvalidArgumentError

__all__ = ["PoolId", "Block", "Stat", "DeviceStats", "abi", "malloc", "free", "device_of", "base_allocation",
           "record_stream", "largest_allocatable", "device_stats", "reset_accumulated", "set_limit", "get_limit",
           "pool_incref", "pool_release", "pool_use_count", "pool_empty", "blocks", "pool_set_live", "ABI"]

ABI = 1  # VTA_TORCH_NATIVE_ABI
u32, u64, i32, i64 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
_P = ctypes.POINTER


class VtaTorchPoolId(ctypes.Structure):
    _fields_ = [("first", u64), ("second", u64)]


class VtaTorchStat(ctypes.Structure):
    _fields_ = [("current", i64), ("peak", i64), ("allocated", i64), ("freed", i64)]


_STAT_ARRAYS = ("allocation", "allocated_bytes", "requested_bytes", "active_bytes", "reserved_bytes", "segment")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


class VtaTorchDeviceStats(ctypes.Structure):
    _fields_ = ([("struct_size", u32), ("reserved0", u32)] + [(n, VtaTorchStat * 3) for n in _STAT_ARRAYS]
                + [(n, i64) for n in _COUNTERS] + [("pool_reserved_bytes", u64)])


class VtaTorchBlock(ctypes.Structure):
    _fields_ = [("address", u64), ("size", u64), ("requested", u64), ("stream", u64), ("pool", VtaTorchPoolId),
                ("state", u32), ("small", u32)]


_PROTOTYPES: _cabi.Prototypes = {
    "vta_torch_native_abi": (i32, []),
    "vta_torch_malloc": (i32, [u64, i32, ctypes.c_void_p, _P(VtaTorchPoolId), _P(ctypes.c_void_p)]),
    "vta_torch_free_ptr": (i32, [ctypes.c_void_p, _P(i32)]),
    "vta_torch_device_of": (i32, [ctypes.c_void_p, _P(i32)]),
    "vta_torch_base_allocation": (i32, [ctypes.c_void_p, _P(ctypes.c_void_p), _P(u64)]),
    "vta_torch_record_stream": (i32, [ctypes.c_void_p, ctypes.c_void_p]),
    "vta_torch_largest_allocatable": (i32, [i32, _P(u64)]),
    "vta_torch_device_stats": (i32, [i32, _P(VtaTorchDeviceStats)]),
    "vta_torch_reset_accumulated": (i32, [i32]),
    "vta_torch_set_limit": (i32, [i32, u64]),
    "vta_torch_get_limit": (i32, [i32, _P(u64)]),
    "vta_torch_pool_incref": (i32, [i32, VtaTorchPoolId]),
    "vta_torch_pool_release": (i32, [i32, VtaTorchPoolId]),
    "vta_torch_pool_use_count": (i32, [i32, VtaTorchPoolId, _P(i32)]),
    "vta_torch_pool_empty": (i32, [i32, VtaTorchPoolId, _P(u64)]),
    "vta_torch_blocks": (i32, [i32, _P(VtaTorchPoolId), _P(VtaTorchBlock), u64, _P(u64)]),
    "vta_torch_pool_set_live": (i32, [i32, VtaTorchPoolId, _P(u64), u64, _P(u64), u64, _P(u64), _P(u64), u64,
                                      _P(u64)]),
}

_declared = False


def _lib() -> ctypes.CDLL:
    global _declared
    lib = _torch_shim.lib()
    if not _declared:
        _cabi.declare(lib, _PROTOTYPES)
        _declared = True
    return lib


def _check(status: int) -> None:
    _torch_shim.check(status)


@dataclasses.dataclass(frozen=True)
class PoolId:
    """PyTorch's MempoolId_t; (0, 0) means no pool."""

    first: int
    second: int

    def _struct(self) -> VtaTorchPoolId:
        return VtaTorchPoolId(as_u64(self.first, "pool id"), as_u64(self.second, "pool id"))


@dataclasses.dataclass(frozen=True)
class Stat:
    current: int
    peak: int
    allocated: int
    freed: int


@dataclasses.dataclass(frozen=True)
class DeviceStats:
    """One device's statistics as PyTorch's quadruples; each array is (all, small, large)."""

    allocation: tuple[Stat, Stat, Stat]
    allocated_bytes: tuple[Stat, Stat, Stat]
    requested_bytes: tuple[Stat, Stat, Stat]
    active_bytes: tuple[Stat, Stat, Stat]
    reserved_bytes: tuple[Stat, Stat, Stat]
    segment: tuple[Stat, Stat, Stat]
    num_alloc_retries: int
    num_ooms: int
    num_sync_all_streams: int
    num_device_alloc: int
    num_device_free: int
    pool_reserved_bytes: int


@dataclasses.dataclass(frozen=True)
class Block:
    address: int
    size: int        # rounded
    requested: int
    stream: int
    pool: PoolId | None
    state: str       # "live" or "pool_cached"
    small: bool


_STATES = {1: "live", 2: "pool_cached"}


def _device(device: int) -> int:
    _torch_shim.check_device(device)
    return device


def _pool_ptr(pool: PoolId | None):
    if pool is None:
        return None
    if not isinstance(pool, PoolId):
        raise InvalidArgumentError(f"pool must be a PoolId or None, got {type(pool).__name__}")
    return ctypes.byref(pool._struct())


def abi() -> int:
    return int(_lib().vta_torch_native_abi())


def malloc(size: int, device: int = 0, stream: int = 0, pool: PoolId | None = None) -> int:
    out = ctypes.c_void_p()
    _check(_lib().vta_torch_malloc(as_u64(size, "size"), _device(device), as_u64(stream, "stream") or None,
                                   _pool_ptr(pool), ctypes.byref(out)))
    return int(out.value or 0)


def free(ptr: int) -> int:
    """Free the block at ``ptr``; returns its device."""
    device = i32()
    _check(_lib().vta_torch_free_ptr(as_u64(ptr, "ptr") or None, ctypes.byref(device)))
    return device.value


def device_of(ptr: int) -> int:
    device = i32()
    _check(_lib().vta_torch_device_of(as_u64(ptr, "ptr") or None, ctypes.byref(device)))
    return device.value


def base_allocation(ptr: int) -> tuple[int, int]:
    base, size = ctypes.c_void_p(), u64()
    _check(_lib().vta_torch_base_allocation(as_u64(ptr, "ptr") or None, ctypes.byref(base), ctypes.byref(size)))
    return int(base.value or 0), size.value


def record_stream(ptr: int, stream: int) -> None:
    _check(_lib().vta_torch_record_stream(as_u64(ptr, "ptr") or None, as_u64(stream, "stream") or None))


def largest_allocatable(device: int = 0) -> int:
    out = u64()
    _check(_lib().vta_torch_largest_allocatable(_device(device), ctypes.byref(out)))
    return out.value


def device_stats(device: int = 0) -> DeviceStats:
    raw = VtaTorchDeviceStats()
    _check(_lib().vta_torch_device_stats(_device(device), ctypes.byref(raw)))
    arrays: dict[str, Any] = {n: tuple(Stat(s.current, s.peak, s.allocated, s.freed) for s in getattr(raw, n)) for n in _STAT_ARRAYS}
    return DeviceStats(**arrays, **{n: getattr(raw, n) for n in _COUNTERS},
                       pool_reserved_bytes=raw.pool_reserved_bytes)


def reset_accumulated(device: int | None = None) -> None:
    _torch_shim.check_device(device, every=True)
    _check(_lib().vta_torch_reset_accumulated(-1 if device is None else device))


def set_limit(device: int, limit_bytes: int) -> None:
    _check(_lib().vta_torch_set_limit(_device(device), as_u64(limit_bytes, "limit")))


def get_limit(device: int = 0) -> int:
    out = u64()
    _check(_lib().vta_torch_get_limit(_device(device), ctypes.byref(out)))
    return out.value


def pool_incref(device: int, pool: PoolId) -> None:
    _check(_lib().vta_torch_pool_incref(_device(device), pool._struct()))


def pool_release(device: int, pool: PoolId) -> None:
    _check(_lib().vta_torch_pool_release(_device(device), pool._struct()))


def pool_use_count(device: int, pool: PoolId) -> int:
    out = i32()
    _check(_lib().vta_torch_pool_use_count(_device(device), pool._struct(), ctypes.byref(out)))
    return out.value


def pool_empty(device: int, pool: PoolId) -> int:
    out = u64()
    _check(_lib().vta_torch_pool_empty(_device(device), pool._struct(), ctypes.byref(out)))
    return out.value


def blocks(device: int = 0, pool: PoolId | None = None) -> list[Block]:
    lib, count = _lib(), u64()
    _check(lib.vta_torch_blocks(_device(device), _pool_ptr(pool), None, 0, ctypes.byref(count)))
    while True:
        buf = (VtaTorchBlock * max(count.value, 1))()
        capacity = count.value
        _check(lib.vta_torch_blocks(device, _pool_ptr(pool), buf, capacity, ctypes.byref(count)))
        if count.value <= capacity:
            break
    out = []
    for b in buf[:count.value]:
        pid = PoolId(b.pool.first, b.pool.second) if (b.pool.first or b.pool.second) else None
        out.append(Block(b.address, b.size, b.requested, b.stream, pid, _STATES[b.state], bool(b.small)))
    return out


def pool_set_live(device: int, pool: PoolId, live: list[int]) -> tuple[list[int], list[int]]:
    """setCheckpointPoolState: (freed, allocated) addresses; nothing changes on an error."""
    n_blocks = len(blocks(device, pool))
    cap = max(n_blocks, 1)
    arr = (u64 * max(len(live), 1))(*[as_u64(a, "address") for a in live])
    freed, allocated = (u64 * cap)(), (u64 * cap)()
    n_freed, n_allocated = u64(), u64()
    _check(_lib().vta_torch_pool_set_live(_device(device), pool._struct(), arr, len(live), freed, cap,
                                          ctypes.byref(n_freed), allocated, cap, ctypes.byref(n_allocated)))
    return list(freed[:n_freed.value]), list(allocated[:n_allocated.value])
