"""The method of the fault campaign: count an operation's injectable backend calls, then fail
each one in turn on a fresh space and check what is left.

Owns: ``World`` (a space whose written bytes are known, and an operation's own state),
``calls`` (the injectable backend calls a space has made, per kind), ``attempt``,
``after_fault`` and ``sweep`` (one operation's clean count, then every Nth call of every kind
failed on a fresh space in the same state, and the checks after each). Shared by faults.py (the
local operations) and faults_service.py (lease and return against a daemon), which both import it:
it imports neither.
Invariants: a fault that escapes untyped, a changed byte, a failed retry, inconsistent books
or a leak is an "other" outcome with its description; each injected failure runs on a space made
for it and closed before the next.
"""

from __future__ import annotations

from typing import Any, Callable

from reliability.common import Tally, leaks, pattern, space_consistent
from vtalloc.allocator import AddressSpace
from vtalloc.allocator.errors import InternalError, VtallocError

MiB = 1 << 20
KINDS = ("copy", "map", "create_page", "set_access")


def calls(space: AddressSpace) -> dict[str, int]:
    st = space.stats()
    return {k: getattr(st, f"num_{k}_calls") for k in KINDS}


class World:
    """A space with written allocations whose bytes are known; the operation's own state in ``ctx``."""

    def __init__(self, space: AddressSpace) -> None:
        self.space = space
        self.data: dict[int, bytes] = {}
        self.ctx: dict[str, Any] = {}

    def alloc(self, n: int, seed: int, evictable: bool = False) -> int:
        a = self.space.malloc(n)
        self.data[a] = pattern(seed, n)
        self.space.write(a, self.data[a])
        if evictable:
            self.space.set_evictable(a)
        return a

    def lost(self) -> str | None:
        live = {r.address for r in self.space.allocations()}
        for a, want in self.data.items():
            if a not in live:
                return f"allocation {a:#x} vanished"
            if self.space.read(a, len(want)) != want:
                return f"bytes of {a:#x} changed"
        return None


def attempt(t: Tally, label: str, w: World, op: Callable[[World], None]) -> bool:
    """Run ``op`` once; True when it raised a typed error (so a retry is due)."""
    try:
        op(w)
    except InternalError as e:
        t.bad(f"{label}: InternalError {e}")
        return True
    except VtallocError as e:
        t.ok(type(e).__name__)
        return True
    except Exception as e:  # noqa: BLE001
        t.bad(f"{label}: untyped {type(e).__name__}: {e}")
        return True
    t.ok("absorbed")
    return False


def after_fault(t: Tally, label: str, w: World, op: Callable[[World], None], failed: bool) -> None:
    """Books, bytes, a retry that succeeds, then close: the checks every injected fault gets."""
    s = w.space
    for kind in KINDS:
        s._inject_fault(kind, 0)  # disarm (a call site the op did not reach this time)
    try:
        s.synchronize()
    except Exception as e:  # noqa: BLE001
        t.bad(f"{label}: synchronize after the fault: {type(e).__name__}: {e}")
    if (why := space_consistent(s)) or (why := w.lost()):
        t.bad(f"{label}: {why}")
    if failed:
        try:
            if "new" in w.ctx or "target" not in w.ctx or w.ctx["target"] in w.data:
                op(w)
        except Exception as e:  # noqa: BLE001
            t.bad(f"{label}: the retry failed: {type(e).__name__}: {e}")
    s.synchronize()
    if (why := space_consistent(s)) or (why := w.lost()):
        t.bad(f"{label}, after the retry: {why}")


def sweep(t: Tally, sites: dict[str, int], name: str, make: Callable[[], AddressSpace],
          setup: Callable[[World], None], op: Callable[[World], None], limit: int) -> None:
    with make() as s:
        w = World(s)
        setup(w)
        before = calls(s)
        op(w)
        counted = {k: v - before[k] for k, v in calls(s).items()}
    for kind in KINDS:
        n_calls = min(counted[kind], limit)
        sites[f"{name}/{kind}"] = counted[kind]
        for n in range(1, n_calls + 1):
            label = f"{name}: {kind} call {n}/{counted[kind]}"
            with make() as s:
                w = World(s)
                setup(w)
                s._inject_fault(kind, 1, skip=n - 1)
                failed = attempt(t, label, w, op)
                after_fault(t, label, w, op, failed)
            if left := leaks():
                t.bad(f"{label}: held after close: {left}")
