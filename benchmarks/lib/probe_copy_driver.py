"""The CUDA driver side of benchmarks/probe_copy_paths.py: a device VMM buffer, the host
targets, copies split over streams and timed, and an optional matmul load beside them.

Owns: Probe (one device's primary context, the buffers and streams it made, each released by
the caller's ExitStack), load_driver(), MatmulLoad (bf16 matmuls through torch on a stream of
the probe, an event after each).
Invariants: cuda-python's driver API only, nothing of vtalloc's library; pages are made with
the properties csrc/backend/cuda_backend.cpp uses (pinned; device pages fd-exportable where
supported; host pages with no handle type; granularity max(recommended, minimum) of the device
page, for host pages too); every CUresult other than CUDA_SUCCESS becomes Refused with its
name; every resource made is registered on the ExitStack the moment it exists.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable


class Refused(Exception):
    """The driver (or cuda-python) said no: `call` returned `code`."""

    def __init__(self, call: str, code: str):
        super().__init__(f"{call}: {code}")
        self.call, self.code = call, code


class Missing(Exception):
    """No cuda-python, driver or device: the one line main() prints before exiting 2."""


def load_driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise Missing(f"cuda-python is not installed ({e}): pip install cuda-python") from None
    try:
        err, *_ = driver.cuInit(0)
    except Exception as e:  # cuda-python raises when it cannot load libcuda
        raise Missing(f"no CUDA driver: cuInit could not run ({type(e).__name__}: {e})") from None
    if err != driver.CUresult.CUDA_SUCCESS:
        raise Missing(f"no usable CUDA driver or device: cuInit returned {getattr(err, 'name', err)}")
    return driver


class Probe:
    """One device's primary context, a device VMM buffer and streams; targets made on request."""

    def __init__(self, d: Any, device: int, max_bytes: int, max_streams: int, stack: contextlib.ExitStack):
        self.d, self.stack = d, stack
        count = self.ok("cuDeviceGetCount", d.cuDeviceGetCount())
        if not 0 <= device < count:
            raise Missing(f"no CUDA device {device} (found {count})")
        self.dev = self.ok("cuDeviceGet", d.cuDeviceGet(device))
        ctx = self.ok("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(self.dev))
        stack.callback(d.cuDevicePrimaryCtxRelease, self.dev)
        self.ok("cuCtxSetCurrent", d.cuCtxSetCurrent(ctx))
        a = d.CUdevice_attribute
        if not self.attribute(a.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED):
            raise Missing(f"CUDA device {device} does not support virtual memory management")
        self.numa_id = self.attribute(a.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, default=-1)
        posix = self.attribute(a.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
        # The device page as cuda_backend.cpp makes it: pinned, on the device, fd-exportable
        # where supported; granularity max(recommended, minimum), used for host pages too.
        self.dev_prop = self.prop(d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, int(self.dev),
                                  d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR if posix
                                  else d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE)
        self.gran = max(self.granularity(self.dev_prop))
        self.nbytes = -(-max_bytes // self.gran) * self.gran
        name = self.ok("cuDeviceGetName", d.cuDeviceGetName(256, self.dev))
        self.info = {"name": bytes(name).split(b"\0", 1)[0].decode(errors="replace"), "ordinal": device,
                     "driver_version": self.ok("cuDriverGetVersion", d.cuDriverGetVersion()),
                     "cuda_python": _cuda_python_version(), "granularity_bytes": self.gran,
                     "host_numa_id": self.numa_id, "posix_fd_export": bool(posix),
                     "host_numa_vmm_supported": bool(self.attribute(
                         a.CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)),
                     "async_engine_count": self.attribute(a.CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT),
                     "multiprocessors": self.attribute(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)}
        self.device_va = self.vmm(self.dev_prop, device_only=True)
        flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        self.origin, *self.streams = (self.owned("cuStreamCreate", d.cuStreamCreate(flags), d.cuStreamDestroy)
                                      for _ in range(1 + max_streams))
        self.start, self.stop = (self.owned("cuEventCreate", d.cuEventCreate(0), d.cuEventDestroy) for _ in range(2))
        untimed = int(d.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.done = [self.owned("cuEventCreate", d.cuEventCreate(untimed), d.cuEventDestroy) for _ in self.streams]

    def ok(self, call: str, result: Any) -> Any:
        err, *values = result if isinstance(result, tuple) else (result,)
        if err != self.d.CUresult.CUDA_SUCCESS:
            raise Refused(call, getattr(err, "name", str(err)))
        return values[0] if len(values) == 1 else (tuple(values) if values else None)

    def owned(self, call: str, result: Any, release: Callable[[Any], Any]) -> Any:
        value = self.ok(call, result)
        self.stack.callback(release, value)
        return value

    def attribute(self, attr: Any, default: int = 0) -> int:
        err, value = self.d.cuDeviceGetAttribute(attr, self.dev)
        return value if err == self.d.CUresult.CUDA_SUCCESS else default

    def prop(self, location_type: Any, location_id: int, handle_types: Any) -> Any:
        p = self.d.CUmemAllocationProp()
        p.type = self.d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.location.type, p.location.id, p.requestedHandleTypes = location_type, location_id, handle_types
        return p

    def granularity(self, prop: Any) -> tuple[int, int]:
        g = self.d.CUmemAllocationGranularity_flags
        return (self.ok("cuMemGetAllocationGranularity", self.d.cuMemGetAllocationGranularity(
                    prop, g.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)),
                self.ok("cuMemGetAllocationGranularity", self.d.cuMemGetAllocationGranularity(
                    prop, g.CU_MEM_ALLOC_GRANULARITY_MINIMUM)))

    def vmm(self, prop: Any, device_only: bool = True) -> int:
        """A handle of self.nbytes made with `prop`, mapped at a reserved VA, read-write for the
        device (and for the host NUMA node unless device_only); released by the stack."""
        d = self.d
        va = int(self.owned("cuMemAddressReserve", d.cuMemAddressReserve(self.nbytes, self.gran, 0, 0),
                            lambda p: d.cuMemAddressFree(p, self.nbytes)))
        handle = self.owned("cuMemCreate", d.cuMemCreate(self.nbytes, prop, 0), d.cuMemRelease)
        self.ok("cuMemMap", d.cuMemMap(va, self.nbytes, 0, handle, 0))
        self.stack.callback(d.cuMemUnmap, va, self.nbytes)
        descs = [self.access(d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, int(self.dev))]
        if not device_only:
            descs.append(self.access(d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA, self.numa_id))
        self.ok("cuMemSetAccess" + ("" if device_only else " (device + HOST_NUMA)"),
                d.cuMemSetAccess(va, self.nbytes, descs, len(descs)))
        return va

    def location_prop(self, location: str) -> Any:
        """The allocation properties of a page at `location`: "device" (the device page), or a
        host target's location with no handle type, as the cuda backend makes host pages;
        Refused where the device has no host NUMA id for a NUMA location."""
        loc, none = self.d.CUmemLocationType, self.d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE
        if location == "device":
            return self.dev_prop
        if location in ("host_numa", "host_numa_cpu") and self.numa_id < 0:
            raise Refused("cuDeviceGetAttribute(HOST_NUMA_ID)", f"no host NUMA id ({self.numa_id})")
        where = {"host_numa": (loc.CU_MEM_LOCATION_TYPE_HOST_NUMA, self.numa_id),
                 "host_numa_cpu": (loc.CU_MEM_LOCATION_TYPE_HOST_NUMA, self.numa_id),
                 "host": (loc.CU_MEM_LOCATION_TYPE_HOST, 0),
                 "host_numa_current": (loc.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT, 0)}[location]
        return self.prop(*where, none)

    def time_mapping_calls(self, location: str, nbytes: int, reps: int) -> dict[str, list[float]]:
        """Wall microseconds of each VMM call in the life of one handle of `nbytes` at `location`,
        `reps` times: cuMemCreate, cuMemMap, cuMemSetAccess (device read-write, as the engine
        grants it to device and host pages alike), cuMemUnmap, cuMemRelease. Mapped-mode
        eviction makes, maps and grants access to host-located handles, and the copy into them
        alone ran at pinned speed on the H100 (2026-11-26): these say what the calls around it
        cost by location and size. One reservation of `nbytes`, released with the probe; each
        handle is unmapped and released before the next, also when a call is refused."""
        d = self.d
        prop = self.location_prop(location)
        va = int(self.owned("cuMemAddressReserve", d.cuMemAddressReserve(nbytes, self.gran, 0, 0),
                            lambda p: d.cuMemAddressFree(p, nbytes)))
        desc = [self.access(d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, int(self.dev))]
        out: dict[str, list[float]] = {k: [] for k in ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                                                        "cuMemRelease")}

        def timed(call: str, fn: Callable[[], Any]) -> Any:
            t0 = time.perf_counter()
            result = fn()
            out[call].append((time.perf_counter() - t0) * 1e6)
            return self.ok(call, result)

        for _ in range(reps):
            handle = timed("cuMemCreate", lambda: d.cuMemCreate(nbytes, prop, 0))
            try:
                timed("cuMemMap", lambda h=handle: d.cuMemMap(va, nbytes, 0, h, 0))
                try:
                    timed("cuMemSetAccess", lambda: d.cuMemSetAccess(va, nbytes, desc, 1))
                finally:
                    timed("cuMemUnmap", lambda: d.cuMemUnmap(va, nbytes))
            finally:
                timed("cuMemRelease", lambda h=handle: d.cuMemRelease(h))
        return out

    def access(self, location_type: Any, location_id: int) -> Any:
        a = self.d.CUmemAccessDesc()
        a.location.type, a.location.id = location_type, location_id
        a.flags = self.d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return a

    def target(self, name: str) -> int:
        """The address of a target of self.nbytes; Refused if the driver will not make it."""
        d = self.d
        if name == "pinned":  # as HostPool's copy-mode chunks: cuMemHostAlloc(PORTABLE)
            return int(self.owned("cuMemHostAlloc", d.cuMemHostAlloc(self.nbytes, d.CU_MEMHOSTALLOC_PORTABLE),
                                  d.cuMemFreeHost))
        return self.vmm(self.location_prop(name), device_only=name != "host_numa_cpu")

    def issue(self, method: str) -> Callable[[int, int, int, Any], None]:
        d = self.d
        if method == "memcpy_async":
            return lambda dst, src, n, s: self.ok("cuMemcpyAsync", d.cuMemcpyAsync(dst, src, n, s))
        if not hasattr(d, "cuMemcpyBatchAsync"):
            raise Refused("cuMemcpyBatchAsync", "not in this cuda-python")
        attr = d.CUmemcpyAttributes()
        attr.srcAccessOrder = d.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        flag = d.CUmemcpyFlags.CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE if method == "batch_ce" else \
            d.CUmemcpyFlags.CU_MEMCPY_FLAG_DEFAULT
        attr.flags = int(flag)
        # cuda-python 12.8-12.9 returns (err, failIdx), 13.x (err,): ok() takes either.
        return lambda dst, src, n, s: self.ok("cuMemcpyBatchAsync", d.cuMemcpyBatchAsync(
            [d.CUdeviceptr(dst)], [d.CUdeviceptr(src)], [n], 1, [attr], [0], 1, s))

    def time_copies(self, issue: Callable, dst: int, src: int, plan: list[tuple[int, int]],
                    reps: int) -> tuple[list[float], list[float]]:
        """reps + 1 copies, piece k of `plan` ((offset, length)) on stream k, all after one event on
        the origin stream and joined back to it; the first (warm-up) is dropped. Event and wall ms."""
        d = self.d
        event_ms, wall_ms = [], []
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            self.ok("cuEventRecord", d.cuEventRecord(self.start, self.origin))
            for k, (off, n) in enumerate(plan):
                s = self.streams[k]
                self.ok("cuStreamWaitEvent", d.cuStreamWaitEvent(s, self.start, 0))
                issue(dst + off, src + off, n, s)
                self.ok("cuEventRecord", d.cuEventRecord(self.done[k], s))
                self.ok("cuStreamWaitEvent", d.cuStreamWaitEvent(self.origin, self.done[k], 0))
            self.ok("cuEventRecord", d.cuEventRecord(self.stop, self.origin))
            self.ok("cuEventSynchronize", d.cuEventSynchronize(self.stop))
            wall = (time.perf_counter() - t0) * 1e3
            if rep:
                event_ms.append(self.elapsed_ms(self.start, self.stop))
                wall_ms.append(wall)
        return event_ms, wall_ms

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return float(self.ok("cuEventElapsedTime", self.d.cuEventElapsedTime(a, b)))

    def event(self) -> Any:
        return self.owned("cuEventCreate", self.d.cuEventCreate(0), self.d.cuEventDestroy)

    def record(self, event: Any, stream: Any) -> None:
        self.ok("cuEventRecord", self.d.cuEventRecord(event, stream))

    def target_granularity(self, target: str) -> dict[str, Any]:
        """The driver's granularity for a host page of `target`'s location (recorded, not used:
        host pages take the device page's, as vtalloc's do)."""
        loc = self.d.CUmemLocationType
        t = {"host": loc.CU_MEM_LOCATION_TYPE_HOST,
             "host_numa_current": loc.CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT}.get(target, loc.CU_MEM_LOCATION_TYPE_HOST_NUMA)
        try:
            rec, minimum = self.granularity(self.prop(t, max(self.numa_id, 0),
                                                      self.d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_NONE))
            return {"recommended": rec, "minimum": minimum}
        except Refused as e:
            return {"refused": e.code}


class MatmulLoad:
    """bf16 n x n matmuls through torch on a stream of the probe, a driver event before the
    first and after each, so their times can be set against the copies' own events."""

    def __init__(self, probe: Probe, n: int = 8192):
        import torch

        if not torch.cuda.is_available():
            raise Refused("torch.cuda.is_available", "False")
        self.probe, self.torch = probe, torch
        d = probe.d
        self.handle = probe.owned("cuStreamCreate", d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)),
                                  d.cuStreamDestroy)
        dev = torch.device("cuda", probe.info["ordinal"])
        self.stream = torch.cuda.ExternalStream(int(self.handle), device=dev)
        with torch.cuda.stream(self.stream):
            self.a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            self.b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            self.c = torch.empty_like(self.a)
        probe.stack.callback(self._drop)
        self.events: list[Any] = []

    def _drop(self) -> None:
        self.stream.synchronize()
        del self.a, self.b, self.c

    def enqueue(self, k: int) -> list[tuple[Any, Any]]:
        """k matmuls queued on the load's stream; (before, after) events of each."""
        while len(self.events) < k + 1:
            self.events.append(self.probe.event())
        self.probe.record(self.events[0], self.handle)
        with self.torch.cuda.stream(self.stream):
            for i in range(k):
                self.torch.matmul(self.a, self.b, out=self.c)
                self.probe.record(self.events[i + 1], self.handle)
        return list(zip(self.events[:k], self.events[1:k + 1]))

    def alone_ms(self, k: int = 20) -> float:
        """Median ms of one matmul with nothing else running (after a warm-up batch)."""
        self.enqueue(5)
        self.stream.synchronize()
        spans = self.enqueue(k)
        self.stream.synchronize()
        return sorted(self.probe.elapsed_ms(a, b) for a, b in spans)[k // 2]


def _cuda_python_version() -> str | None:
    try:
        import cuda.bindings as b
        return getattr(b, "__version__", None)
    except ImportError:
        return None


