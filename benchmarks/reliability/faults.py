"""Fault injection at every backend call site each public operation reaches.

Owns: the operations under test (malloc: fresh pages, reused pages and under pressure; free;
offload; prefetch + ensure_resident; trim; close; and for a service-backed space lease and
return; the local ones once with one-page handles and once with extents) and the close sweep;
the method (counting call sites, failing each, the checks after) is fault_sweep.py's.
How: a clean run of the operation counts the injectable backend calls it makes (copy, map,
create_page, set_access: the operations FaultInjectingBackend can fail); then for each kind
and each N = 1..count, a fresh space in the same state fails exactly the Nth call of that
kind (``_inject_fault(kind, skip=N-1)``). The operation must end in a typed error, or
complete (the failure absorbed by a retry); then the space's books must agree, every byte
written before must read back the same, the operation must succeed when tried again, and
after close nothing may be held (no page, no pinned byte, no descriptor).
Invariants: a fault that escapes untyped, a changed byte, a failed retry, inconsistent books
or a leak is an "other" outcome with its description.
"""

from __future__ import annotations

from typing import Any, Callable

from reliability import faults_service
from reliability.common import Tally, leaks
from reliability.fault_sweep import KINDS, World, calls, sweep
from vtalloc.allocator import AddressSpace

MiB = 1 << 20


def host(capacity: str = "16MiB", **kw: Any) -> AddressSpace:
    return AddressSpace(backend="host", capacity=capacity, host_capacity="64MiB", **kw)


# -- operations: (setup, op); op may record a new allocation in w.ctx["new"] ----------------------

def _malloc_fresh(w: World) -> None:
    w.ctx["new"] = w.space.malloc(5 * MiB)


def _setup_reuse(w: World) -> None:
    w.alloc(MiB, 1)
    w.space.free(w.alloc(6 * MiB, 2))
    w.space.free(w.space.malloc(512))  # a small block's page, freed


def _setup_pressure(w: World) -> None:
    for i in range(3):
        w.alloc(4 * MiB, 10 + i, evictable=True)


def _malloc_pressure(w: World) -> None:
    w.ctx["new"] = w.space.malloc(8 * MiB)  # needs two of the evictable allocations' pages


def _setup_one(w: World, evicted: bool = False) -> None:
    w.ctx["target"] = w.alloc(6 * MiB + 123, 20, evictable=True)
    w.alloc(MiB, 21)
    if evicted:
        w.space.offload(w.ctx["target"])
        w.space.synchronize()


def _free(w: World) -> None:
    a = w.ctx["target"]
    w.space.free(a)
    del w.data[a]


def _offload(w: World) -> None:
    w.space.offload(w.ctx["target"])
    w.space.synchronize()


def _restore(w: World) -> None:
    w.space.prefetch(w.ctx["target"])
    w.space.ensure_resident(w.ctx["target"])


def _trim(w: World) -> None:
    w.space.trim()


def _setup_trim(w: World) -> None:
    w.alloc(MiB, 30)
    w.space.free(w.space.malloc(8 * MiB))


OPERATIONS: dict[str, tuple[Callable[[World], None], Callable[[World], None]]] = {
    "malloc_fresh": (lambda w: w.alloc(MiB, 0), _malloc_fresh),
    "malloc_reuse": (_setup_reuse, _malloc_fresh),
    "malloc_under_pressure": (_setup_pressure, _malloc_pressure),
    "free": (_setup_one, _free),
    "offload": (_setup_one, _offload),
    "prefetch_restore": (lambda w: _setup_one(w, evicted=True), _restore),
    "trim": (_setup_trim, _trim),
}


def close_sweep(t: Tally, sites: dict[str, int]) -> None:
    """close makes no injectable call (unmap and release are not injectable): checked for that,
    and a close while a fault is armed must release everything."""
    for kind in KINDS:
        s = host()
        w = World(s)
        _setup_one(w, evicted=True)
        before = calls(s)
        s._inject_fault(kind, 1)
        try:
            s.close()
            t.ok("closed")
        except Exception as e:  # noqa: BLE001
            t.bad(f"close with {kind} armed: {type(e).__name__}: {e}")
        sites[f"close/{kind}"] = 0
        if left := leaks():
            t.bad(f"close with {kind} armed: held after close: {left}")
        del before


def run(scale: int, seed: int) -> dict[str, Any]:
    t = Tally()
    sites: dict[str, int] = {}
    limit = 8 * scale  # call sites per (operation, kind); a clean run counts them all
    for name, (setup, op) in OPERATIONS.items():
        sweep(t, sites, name, host, setup, op, limit)
        # Again with extents of at most 4 MiB (from 4 MiB up): the 5-8 MiB allocations above get
        # a two-page extent (and a page), so every extent path meets each fault too.
        sweep(t, sites, f"{name}@extents", lambda: host(extent_size="4MiB"), setup, op, limit)
    close_sweep(t, sites)
    faults_service.run_into(t, sites, limit)
    return {"injected": t, "call_sites": sites, "limit_per_kind": limit, "leaks_after": leaks()}
