"""A simulated `cuda.bindings.driver` for the copy-path probe (benchmarks/probe_copy_paths.py),
so its whole driver path runs on a CPU before the one GPU call it is written for.

Owns: FakeDriver: the calls, enums and structs the probe uses, with cuda-python's calling
convention (every call returns a tuple whose first item is a CUresult).
Invariants: it moves no bytes; every copy's two ranges must lie inside one mapped (or pinned)
range, and every handle, mapping, reservation, stream and event is counted while alive, so a
test can check the probe released all it made. Time is virtual: a copy advances its stream's
clock by bytes / the rate of its (kind, direction, method) in `rates` (GB/s), one copy at a time
per direction (one link, as PCIe: more streams add nothing); events take their stream's clock;
cuStreamWaitEvent moves a stream's clock forward. Refusals follow cuda.h:
cuMemCreate with HOST_NUMA_CURRENT is CUDA_ERROR_INVALID_VALUE; a HOST_NUMA access
descriptor is refused with CUDA_ERROR_NOT_SUPPORTED when `host_numa_access` is False.
"""

from __future__ import annotations

import enum
import itertools
from types import SimpleNamespace
from typing import Any


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_SUPPORTED = 801


def _enum(name: str, *members: str) -> type[enum.IntEnum]:
    return enum.IntEnum(name, {m: i + 1 for i, m in enumerate(members)})


CUdevice_attribute = _enum("CUdevice_attribute", "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
                           "CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID", "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
                           "CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
                           "CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT", "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
CUmemLocationType = _enum("CUmemLocationType", "CU_MEM_LOCATION_TYPE_DEVICE", "CU_MEM_LOCATION_TYPE_HOST",
                          "CU_MEM_LOCATION_TYPE_HOST_NUMA", "CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT")
CUmemAllocationHandleType = _enum("CUmemAllocationHandleType", "CU_MEM_HANDLE_TYPE_NONE",
                                  "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")
CUmemAllocationType = _enum("CUmemAllocationType", "CU_MEM_ALLOCATION_TYPE_PINNED")
CUmemAllocationGranularity_flags = _enum("CUmemAllocationGranularity_flags", "CU_MEM_ALLOC_GRANULARITY_MINIMUM",
                                         "CU_MEM_ALLOC_GRANULARITY_RECOMMENDED")
CUstream_flags = _enum("CUstream_flags", "CU_STREAM_NON_BLOCKING")
CUevent_flags = _enum("CUevent_flags", "CU_EVENT_DISABLE_TIMING")
CUmemAccess_flags = _enum("CUmemAccess_flags", "CU_MEM_ACCESS_FLAGS_PROT_READWRITE")
CUmemcpySrcAccessOrder = _enum("CUmemcpySrcAccessOrder", "CU_MEMCPY_SRC_ACCESS_ORDER_STREAM")
CUmemcpyFlags = enum.IntEnum("CUmemcpyFlags", {"CU_MEMCPY_FLAG_DEFAULT": 0,
                                               "CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE": 1})
CU_MEMHOSTALLOC_PORTABLE = 1
GRAN = 2 << 20
OK = (CUresult.CUDA_SUCCESS,)


class CUdeviceptr(int):
    pass


def CUmemAllocationProp() -> Any:  # noqa: N802 (cuda-python's name)
    return SimpleNamespace(type=None, location=SimpleNamespace(type=None, id=None), requestedHandleTypes=None)


def CUmemAccessDesc() -> Any:  # noqa: N802
    return SimpleNamespace(location=SimpleNamespace(type=None, id=None), flags=None)


def CUmemcpyAttributes() -> Any:  # noqa: N802
    return SimpleNamespace(srcAccessOrder=None, flags=0)


class FakeDriver:
    """One H100-like device; `rates[(kind, direction, method)]` in GB/s, kind "pinned" or "host_page"
    (a host-located VMM page), direction "evict"/"restore", method "memcpy_async"/"batch"/"batch_ce"."""

    def __init__(self, rates: dict[tuple[str, str, str], float], host_numa_access: bool = False):
        for name, value in globals().items():
            if name.startswith("CU"):
                setattr(self, name, value)
        self.rates, self.host_numa_access = rates, host_numa_access
        self.ids = itertools.count(1)
        self.next_va = 1 << 40
        self.live: dict[str, dict[Any, Any]] = {k: {} for k in ("va", "handle", "map", "pinned", "stream", "event", "ctx")}
        self.clock: dict[Any, float] = {}   # stream -> virtual seconds
        self.link = {"evict": 0.0, "restore": 0.0}  # when each direction's link is free
        self.copies: list[tuple[str, str, str, int]] = []

    # -- device and context
    def cuInit(self, flags):  # noqa: N802
        return OK

    def cuDeviceGetCount(self):  # noqa: N802
        return CUresult.CUDA_SUCCESS, 1

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return CUresult.CUDA_SUCCESS, ordinal

    def cuDevicePrimaryCtxRetain(self, dev):  # noqa: N802
        self.live["ctx"][dev] = True
        return CUresult.CUDA_SUCCESS, "ctx"

    def cuDevicePrimaryCtxRelease(self, dev):  # noqa: N802
        self.live["ctx"].pop(dev)
        return OK

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        return OK

    def cuDeviceGetAttribute(self, attr, dev):  # noqa: N802
        values = {"HOST_NUMA_ID": 0, "ASYNC_ENGINE_COUNT": 3, "MULTIPROCESSOR_COUNT": 132}
        return CUresult.CUDA_SUCCESS, next((v for k, v in values.items() if attr.name.endswith(k)), 1)

    def cuDeviceGetName(self, length, dev):  # noqa: N802
        return CUresult.CUDA_SUCCESS, b"Fake H100\0"

    def cuDriverGetVersion(self):  # noqa: N802
        return CUresult.CUDA_SUCCESS, 13000

    # -- virtual memory
    def cuMemGetAllocationGranularity(self, prop, option):  # noqa: N802
        return CUresult.CUDA_SUCCESS, GRAN

    def cuMemAddressReserve(self, size, align, addr, flags):  # noqa: N802
        va = self.next_va
        self.next_va += size + GRAN
        self.live["va"][va] = size
        return CUresult.CUDA_SUCCESS, CUdeviceptr(va)

    def cuMemAddressFree(self, va, size):  # noqa: N802
        return OK if self.live["va"].pop(int(va), None) == size else (CUresult.CUDA_ERROR_INVALID_VALUE,)

    def cuMemCreate(self, size, prop, flags):  # noqa: N802
        t = prop.location.type
        if t == CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT or size % GRAN:
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        if t != CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE and (
                prop.requestedHandleTypes != CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE):
            return CUresult.CUDA_ERROR_INVALID_VALUE, None
        h = next(self.ids)
        self.live["handle"][h] = ("device" if t == CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE else "host_page", size)
        return CUresult.CUDA_SUCCESS, h

    def cuMemRelease(self, h):  # noqa: N802
        return OK if self.live["handle"].pop(h, None) else (CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuMemMap(self, va, size, offset, h, flags):  # noqa: N802
        if h not in self.live["handle"] or self.live["handle"][h][1] != size or offset:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        self.live["map"][int(va)] = (self.live["handle"][h][0], size)
        return OK

    def cuMemUnmap(self, va, size):  # noqa: N802
        return OK if self.live["map"].pop(int(va), None) else (CUresult.CUDA_ERROR_INVALID_VALUE,)

    def cuMemSetAccess(self, va, size, descs, count):  # noqa: N802
        if int(va) not in self.live["map"] or len(descs) != count:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if any(d.location.type == CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA for d in descs) \
                and not self.host_numa_access:
            return (CUresult.CUDA_ERROR_NOT_SUPPORTED,)
        return OK

    def cuMemHostAlloc(self, size, flags):  # noqa: N802
        va = self.next_va
        self.next_va += size + GRAN
        self.live["pinned"][va] = ("pinned", size)
        return CUresult.CUDA_SUCCESS, va

    def cuMemFreeHost(self, p):  # noqa: N802
        return OK if self.live["pinned"].pop(p, None) else (CUresult.CUDA_ERROR_INVALID_VALUE,)

    # -- streams, events, copies
    def cuStreamCreate(self, flags):  # noqa: N802
        s = f"stream{next(self.ids)}"
        self.live["stream"][s] = True
        self.clock[s] = 0.0
        return CUresult.CUDA_SUCCESS, s

    def cuStreamDestroy(self, s):  # noqa: N802
        return OK if self.live["stream"].pop(s, None) else (CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuEventCreate(self, flags):  # noqa: N802
        e = f"event{next(self.ids)}"
        self.live["event"][e] = None
        return CUresult.CUDA_SUCCESS, e

    def cuEventDestroy(self, e):  # noqa: N802
        return OK if self.live["event"].pop(e, 0) != 0 else (CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuEventRecord(self, e, s):  # noqa: N802
        self.live["event"][e] = self.clock[s]
        return OK

    def cuStreamWaitEvent(self, s, e, flags):  # noqa: N802
        self.clock[s] = max(self.clock[s], self.live["event"][e])
        return OK

    def cuEventSynchronize(self, e):  # noqa: N802
        return OK if self.live["event"][e] is not None else (CUresult.CUDA_ERROR_INVALID_HANDLE,)

    def cuEventElapsedTime(self, a, b):  # noqa: N802
        return CUresult.CUDA_SUCCESS, (self.live["event"][b] - self.live["event"][a]) * 1e3

    def _kind(self, p: int, n: int) -> str | None:
        for table in (self.live["map"], self.live["pinned"]):
            for base, (kind, size) in table.items():
                if base <= p and p + n <= base + size:
                    return kind
        return None

    def _copy(self, dst: int, src: int, n: int, s: str, method: str) -> tuple:
        kinds = self._kind(int(dst), n), self._kind(int(src), n)
        if None in kinds or "device" not in kinds or kinds == ("device", "device"):
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        direction, kind = ("evict", kinds[0]) if kinds[1] == "device" else ("restore", kinds[1])
        start = max(self.clock[s], self.link[direction])
        self.clock[s] = self.link[direction] = start + n / (self.rates[(kind, direction, method)] * 1e9)
        self.copies.append((kind, direction, method, n))
        return OK

    def cuMemcpyAsync(self, dst, src, n, s):  # noqa: N802
        return self._copy(dst, src, n, s, "memcpy_async")

    def cuMemcpyBatchAsync(self, dsts, srcs, sizes, count, attrs, idxs, nattrs, s):  # noqa: N802
        if not (len(dsts) == len(srcs) == len(sizes) == count and len(attrs) == len(idxs) == nattrs and idxs[0] == 0
                and all(a.srcAccessOrder == CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM for a in attrs)):
            return CUresult.CUDA_ERROR_INVALID_VALUE, 0
        method = "batch_ce" if attrs[0].flags & CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE else "batch"
        for d, sr, n in zip(dsts, srcs, sizes):
            r = self._copy(d, sr, n, s, method)
            if r != OK:
                return r[0], 0
        return CUresult.CUDA_SUCCESS, 0  # cuda-python 12.8-12.9 shape: (err, failIdx)

    def held(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.live.items() if v}
