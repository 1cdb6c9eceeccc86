"""What the CUDA driver itself says about a device, read through NVIDIA's cuda-python bindings.

Owns: :func:`device_info` (name, driver version, memory free/total, VMM and host-NUMA VMM
support) — an independent witness of vtalloc's own accounting: the GPU tests check that the
driver's free memory drops by what a space maps and comes back when it closes (leaks in
similar allocators were only visible that way). cuda-python is imported inside the function,
so importing vtalloc never loads it.
Invariant: a missing driver or device raises BackendUnavailableError; any other driver
failure raises DriverError: nothing is guessed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import BackendUnavailableError, DriverError
from .extras import CUDA_INSTALL

__all__ = ["DeviceInfo", "device_info"]


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    device: int
    name: str
    driver_version: int           # as cuDriverGetVersion: 13000 for CUDA 13.0
    total_bytes: int
    free_bytes: int               # cuMemGetInfo in the device's primary context
    vmm_supported: bool
    host_numa_vmm_supported: bool  # host-located VMM pages: vtalloc's "mapped" eviction mode


def _unavailable_codes(d: Any) -> set[Any]:
    r = d.CUresult
    return {r.CUDA_ERROR_NO_DEVICE, r.CUDA_ERROR_INVALID_DEVICE, r.CUDA_ERROR_NOT_INITIALIZED,
            r.CUDA_ERROR_INSUFFICIENT_DRIVER, r.CUDA_ERROR_NOT_SUPPORTED}


def _call(d: Any, what: str, result: tuple) -> Any:
    err, *values = result
    if err != d.CUresult.CUDA_SUCCESS:
        if err in _unavailable_codes(d):
            raise BackendUnavailableError(f"no usable CUDA device: {what} returned {err.name}")
        raise DriverError(f"{what} failed: {err.name}")
    return values[0] if len(values) == 1 else tuple(values)


def device_info(device: int = 0) -> DeviceInfo:
    """The driver's view of ``device``; BackendUnavailableError where there is no driver or device."""
    try:
        from cuda.bindings import driver as d
        from cuda.pathfinder import DynamicLibNotFoundError
    except ImportError as e:
        raise BackendUnavailableError(f"cuda-python is not installed ({e}): {CUDA_INSTALL}") from None
    try:
        _call(d, "cuInit", d.cuInit(0))
    except DynamicLibNotFoundError:
        raise BackendUnavailableError("no CUDA driver: libcuda could not be loaded") from None
    count = _call(d, "cuDeviceGetCount", d.cuDeviceGetCount())
    if not 0 <= device < count:
        raise BackendUnavailableError(f"no CUDA device {device} (found {count})")
    dev = _call(d, "cuDeviceGet", d.cuDeviceGet(device))
    name = _call(d, "cuDeviceGetName", d.cuDeviceGetName(256, dev))
    attr = d.CUdevice_attribute

    def attribute(a: Any) -> int:
        err, value = d.cuDeviceGetAttribute(a, dev)
        return value if err == d.CUresult.CUDA_SUCCESS else 0  # an attribute this driver lacks: unsupported

    ctx = _call(d, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(dev))
    try:
        _call(d, "cuCtxPushCurrent", d.cuCtxPushCurrent(ctx))
        try:
            free, total = _call(d, "cuMemGetInfo", d.cuMemGetInfo())
        finally:
            d.cuCtxPopCurrent()
    finally:
        d.cuDevicePrimaryCtxRelease(dev)
    return DeviceInfo(
        device=device,
        name=bytes(name).split(b"\0", 1)[0].decode(errors="replace"),
        driver_version=_call(d, "cuDriverGetVersion", d.cuDriverGetVersion()),
        total_bytes=int(total), free_bytes=int(free),
        vmm_supported=bool(attribute(attr.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)),
        host_numa_vmm_supported=bool(attribute(attr.CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)),
    )
