"""Where an eviction's and a restore's time goes beside the copy itself, on a GPU.

bench_evict.py reports one rate per mode at one size. On the H200 of 2026-11-28 copy mode moved a
32 MiB allocation at 90% of pinned cudaMemcpy out and 87% back; mapped mode at 62% / 76%. This
probe separates the fixed cost of a cycle from its bandwidth so the cause can be named: for each
mode and size it times (wall clock, median of --repeats) offload + synchronize and
ensure_resident of one evictable allocation, counts the driver calls each made, and fits
time = fixed + bytes / rate over the sizes; beside them, pinned copies through torch timed both
by CUDA events (the device's time, bench_evict's reference) and by the wall clock from the call
to the end of a synchronize (what any caller pays).

Owns: the probe's JSON. Measures; changes nothing of vtalloc's.
Invariants: every space is closed before the next; a mode the driver refuses is recorded with
its reason; exits 0 with figures, 2 without a GPU.

    python benchmarks/probe_restore_overhead.py --out "$OUT/restore_overhead.json"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from lib.pinned_copy import pinned_copy_times

MiB = 1 << 20
SIZES = (8 * MiB, 32 * MiB, 128 * MiB, 512 * MiB)
COUNTERS = ("num_map_calls", "num_unmap_calls", "num_set_access_calls", "num_create_page_calls",
            "num_release_page_calls", "num_copy_calls", "num_event_record_calls", "num_event_synchronize_calls",
            "num_stream_wait_event_calls", "num_reserve_calls")


def fit(points: list[tuple[int, float]]) -> dict:
    """Least squares time = fixed_s + bytes / rate."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    fixed = my - slope * mx
    return {"fixed_us": round(fixed * 1e6, 1), "rate_GBps": round(1 / slope / 1e9, 2) if slope > 0 else None}


def cycle(mode: str, size: int, repeats: int, backend: str = "cuda") -> dict:
    from vtalloc.allocator import AddressSpace

    space = AddressSpace(backend=backend, capacity=size + 8 * MiB, host_capacity=size + 8 * MiB, evict_mode=mode)
    with space:
        a = space.malloc(size)
        space.write(a, os.urandom(MiB) * (size // MiB))
        space.set_evictable(a)
        evict, restore, calls_e, calls_r = [], [], {}, {}
        for _ in range(repeats + 1):  # the first cycle warms the host pool and the handle cache
            s0 = space.stats().as_dict()
            t0 = time.perf_counter()
            space.offload(a)
            space.synchronize()
            t1 = time.perf_counter()
            s1 = space.stats().as_dict()
            space.ensure_resident(a)
            t2 = time.perf_counter()
            s2 = space.stats().as_dict()
            evict.append(t1 - t0)
            restore.append(t2 - t1)
            calls_e = {k: s1[k] - s0[k] for k in COUNTERS if k in s0 and s1[k] != s0[k]}
            calls_r = {k: s2[k] - s1[k] for k in COUNTERS if k in s1 and s2[k] != s1[k]}
        space.free(a)
        active = space.evict_mode
    e, r = statistics.median(evict[1:]), statistics.median(restore[1:])
    return {"mode": mode, "active_mode": active, "size_bytes": size, "evict_s": e, "restore_s": r,
            "evict_GBps": round(size / e / 1e9, 2), "restore_GBps": round(size / r / 1e9, 2),
            "calls_per_evict": calls_e, "calls_per_restore": calls_r}


def reference(size: int, repeats: int) -> dict:
    out = {}
    for name, t in pinned_copy_times(size, repeats).items():
        event, wall = statistics.median(t["event_s"]), statistics.median(t["wall_s"])
        out[name] = {"event_GBps": round(size / event / 1e9, 2), "wall_GBps": round(size / wall / 1e9, 2),
                     "event_s": event, "wall_s": wall}
    return out


def driver_call_costs(sizes: tuple[int, ...] = (2 * MiB, 32 * MiB, 256 * MiB), reps: int = 20) -> dict:
    """Wall time of the VMM calls a copy-mode cycle makes, per handle size, straight through
    libcuda (ctypes): create, map, set_access, unmap, release, in the device's primary context."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")

    class Location(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class Flags(ctypes.Structure):
        _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]

    class Prop(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                    ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", Flags)]

    class Access(ctypes.Structure):
        _fields_ = [("location", Location), ("flags", ctypes.c_int)]

    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what}: CUresult {rc}")

    ok(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    prop = Prop(type=1, requestedHandleTypes=0, location=Location(1, 0))
    access = Access(location=Location(1, 0), flags=3)
    out = {}
    for size in sizes:
        va = ctypes.c_uint64()
        ok(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0),
                                  ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        times: dict[str, list[float]] = {k: [] for k in ("create", "map", "set_access", "unmap", "release")}
        for _ in range(reps):
            h = ctypes.c_uint64()
            t0 = time.perf_counter()
            ok(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0)), "create")
            t1 = time.perf_counter()
            ok(cu.cuMemMap(va, ctypes.c_size_t(size), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)), "map")
            t2 = time.perf_counter()
            ok(cu.cuMemSetAccess(va, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)), "set_access")
            t3 = time.perf_counter()
            ok(cu.cuMemUnmap(va, ctypes.c_size_t(size)), "unmap")
            t4 = time.perf_counter()
            ok(cu.cuMemRelease(h), "release")
            t5 = time.perf_counter()
            for k, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                times[k].append(dt)
        ok(cu.cuMemAddressFree(va, ctypes.c_size_t(size)), "cuMemAddressFree")
        out[str(size)] = {k: round(statistics.median(v) * 1e6, 1) for k, v in times.items()}
    cu.cuDevicePrimaryCtxRelease(dev)
    return {"median_us": out, "reps": reps}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--backend", choices=["cuda", "host"], default="cuda",
                    help="host: the same cycles on the host backend (checks the probe itself; no reference)")
    a = ap.parse_args(argv)
    from vtalloc.allocator import backend_available

    ok, why = backend_available(a.backend)
    if not ok:
        print(f"no GPU: {why}")
        return 2
    record: dict = {"probe": "restore_overhead", "rows": [], "reference": {}, "fits": {}}
    for size in SIZES:
        if a.backend == "cuda":
            record["reference"][str(size)] = reference(size, a.repeats)
        for mode in ("copy", "mapped", "auto"):
            try:
                row = cycle(mode, size, a.repeats, a.backend)
            except Exception as e:  # noqa: BLE001 - a mode the driver refuses: recorded, not fatal
                row = {"mode": mode, "size_bytes": size, "unavailable": str(e)[:300]}
            record["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.startswith("calls")}), flush=True)
    for mode in ("copy", "mapped"):
        rows = [r for r in record["rows"] if r["mode"] == mode and "evict_s" in r]
        if len(rows) >= 2:
            record["fits"][mode] = {"evict": fit([(r["size_bytes"], r["evict_s"]) for r in rows]),
                                    "restore": fit([(r["size_bytes"], r["restore_s"]) for r in rows])}
    for d in ("h2d", "d2h") if record["reference"] else ():
        record["fits"][f"reference_{d}_wall"] = fit([(int(s), v[d]["wall_s"]) for s, v in record["reference"].items()])
        record["fits"][f"reference_{d}_event"] = fit([(int(s), v[d]["event_s"]) for s, v in record["reference"].items()])
    if a.backend == "cuda":
        try:
            record["driver_calls"] = driver_call_costs()
        except Exception as e:  # noqa: BLE001 - recorded: the rest of the probe stands
            record["driver_calls"] = {"error": str(e)[:300]}
        print(json.dumps(record["driver_calls"]))
    print(json.dumps(record["fits"]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
