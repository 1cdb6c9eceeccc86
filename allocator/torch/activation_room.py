"""Room for ``paged_activations`` in its space: what moves when a pack or a restore finds none, and what a step needs.

Owns: for one :class:`~.activation_paging.PagedActivations`, the release of the device pages
offloaded tensors still hold (each quarter budget of offloads), making room when the space has no
pages left for a copy (pack) or a restore (unpack, a recipe's borrow): it offloads saved tensors
that nothing but the pager holds, first those backward has finished with (unpacked, their node
done, kept alive only by a retained graph), then those needed last (the oldest packed); the set
of unpacked tensors still in use, and the most bytes of saved tensors the backward held at once
with the one it restored (``need``), which each later forward checks against the capacity so a
step that cannot fit fails at its forward, saying what it needs; the host pool running full
(counted, and warned once per pager: saved tensors then stay resident beyond the budget).
Invariants: a saved tensor in use (autograd's alias of it, or any view of it, alive) is never
moved; the tensor being restored is never moved to make room; room is made only after the space refused,
so a step that fits moves nothing more than the schedule does.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

from ..errors import OutOfMemoryError

__all__ = ["Room", "RoomMaking", "PagerWarning"]

MiB = 1 << 20


class PagerWarning(UserWarning):
    """paged_activations could not keep the budget (host pool full, no room for a saved tensor)."""


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


class Room:
    """The room side of one pager (module docstring). ``sched`` is the scheduler: its lock,
    pager, this iteration's records and the bookkeeping of an offload."""

    def __init__(self, sched: Any) -> None:
        self.sched = sched
        self.lent: dict[int, weakref.ref] = {}  # unpacked records that may still be in use
        self.need = 0                           # most bytes backward held at once, with the one restored
        self.unfit = 0                          # what a backward that found no room held at once, with it
        self._warned: set[str] = set()

    # -- what backward holds ---------------------------------------------------------------
    def in_use_bytes(self, exclude: Any = None) -> int:
        """Bytes of unpacked saved tensors still in use; forgets those that are not."""
        total = 0
        for key, ref in list(self.lent.items()):
            s = ref()
            if s is None or s is exclude:
                continue
            if self.sched.pager.in_use(s.handle):
                total += s.nbytes
            else:
                del self.lent[key]
        return total

    def lent_out(self, s: Any) -> None:
        """``s`` was just unpacked: in use until autograd drops the value; the step's need grows to
        what backward holds now."""
        self.need = max(self.need, self.in_use_bytes(exclude=s) + s.nbytes)
        self.lent[id(s)] = weakref.ref(s)

    def check_forward(self) -> None:
        """At the end of a forward: when an earlier backward of this pager found no room for what it
        holds at once, this step's will not either; it fails here, saying what it needs."""
        room = self.sched.pager.room()
        if not self.unfit or self.unfit + 2 * room["page_bytes"] <= room["capacity_bytes"]:
            return
        raise OutOfMemoryError(
            f"paged_activations: this step's backward holds {_mib(self.unfit)} of saved tensors at once (what one "
            "backward operation reads, with the one restored for it; learned when an earlier backward found no room), "
            f"which with page rounding does not fit the space's capacity of {_mib(room['capacity_bytes'])}: give "
            f"the space at least {_mib(self.unfit + 2 * room['page_bytes'])} (docs/eviction.md, 'Sizing a space "
            "for the pager')", requested_bytes=self.unfit, capacity_bytes=room["capacity_bytes"])

    # -- making room ------------------------------------------------------------------------
    def make_room(self, nbytes: int, exclude: Any = None) -> bool:
        """Offload saved tensors nothing else holds, finished-with first, then needed last, until
        ``nbytes`` and a page have left (or nothing more can); False when nothing moved.
        ``exclude``: the handle being restored."""
        sched = self.sched
        target = nbytes + sched.pager.room()["page_bytes"]
        freed = 0
        with sched._lock:
            for s in self._room_candidates(exclude):
                try:
                    moved = sched._offload_record(s)
                except MemoryError:
                    self.host_pool_full()
                    break
                sched._counts["room_offloads"] += moved > 0
                freed += moved
                if freed >= target:
                    break
        return freed > 0

    def _room_candidates(self, exclude: Any) -> Any:
        from ..activation_plan import PAGE

        sched = self.sched
        records = [r() for r in sched._saved]
        records = [s for s in records if s is not None and s.handle is not exclude and s.kind == PAGE
                   and s.iteration == sched._iteration]
        for consumed in (True, False):
            for s in sorted(records, key=lambda r: r.index):  # the oldest packed: backward's last
                if (s.state == "consumed") != consumed or (s.state == "offloaded" and not s.kept):
                    continue
                if not sched.pager.in_use(s.handle):
                    yield s

    def no_room(self, nbytes: int, cause: Exception) -> OutOfMemoryError:
        held = self.in_use_bytes()
        self.need = max(self.need, held + nbytes)
        self.unfit = max(self.unfit, held + nbytes)
        room = self.sched.pager.room()
        pool = ""
        if room["host_pool_used_bytes"] + nbytes > room["host_pool_capacity_bytes"]:
            pool = (f"; the host pool is full ({_mib(room['host_pool_used_bytes'])} of "
                    f"{_mib(room['host_pool_capacity_bytes'])}): raise host_capacity")
        return OutOfMemoryError(
            f"paged_activations: no room for a saved tensor of {_mib(nbytes)} in a space of "
            f"{_mib(room['capacity_bytes'])}: {_mib(held)} of saved tensors are in use (held by autograd) and "
            f"nothing else the pager holds can move{pool}. This step needs at least "
            f"{_mib(held + nbytes + 2 * room['page_bytes'])} for its saved tensors at this point (docs/eviction.md, "
            f"'Sizing a space for the pager'); the space said: {cause}",
            requested_bytes=nbytes, capacity_bytes=room["capacity_bytes"])

    # -- held pages ------------------------------------------------------------------------
    def release_held(self) -> None:
        """Unmap the device pages offloaded tensors still hold (lock held). An offload leaves its
        device page held (a restore before memory runs short then costs no copy); the oldest
        tensors are the last backward needs, so holding them only keeps the space's mapped bytes
        at everything saved rather than at the budget. Once the offloaded bytes since the last
        release pass the slack, one call unmaps them all: one wait for the streams that may touch
        them per slack's worth of offloads, not one per tensor. Copies still in flight keep their
        pages: if they alone hold more than the slack, the forward pass is running ahead of the
        copy link, and the release waits for them (the back-pressure that keeps mapped bytes
        bounded; ``release_waits`` counts it). What still cannot be released stays counted; the
        next release comes a slack's worth later."""
        sched = self.sched
        release = getattr(sched.pager, "release_offloaded", None)
        if release is None:
            sched._held_bytes = 0
            return
        slack = sched._release_slack
        sched._held_bytes = max(sched._held_bytes - release(), 0)
        sched._counts["releases"] += 1
        if sched._held_bytes > slack:
            sched._held_bytes = max(sched._held_bytes - release(wait=True), 0)
            sched._counts["release_waits"] += 1
        sched._release_at = sched._held_bytes + slack

    # -- the budget not kept ----------------------------------------------------------------
    def host_pool_full(self) -> None:
        sched = self.sched
        sched._counts["host_pool_full"] += 1
        self.warn("host_pool", "the space's host pool is full: saved tensors stay resident beyond the budget "
                  f"({_mib(sched._resident_bytes)} resident, budget {_mib(sched.budget)}); raise the space's "
                  "host_capacity (PagedStats.host_pool_full counts these)")

    def no_room_at_pack(self, nbytes: int) -> None:
        self.warn("pack", f"no room in the space for a saved tensor of {_mib(nbytes)}: autograd keeps it outside "
                  "the space, beyond the budget (PagedStats.passed_through_no_room counts these); give the "
                  "space more capacity (docs/eviction.md, 'Sizing a space for the pager')")

    def warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"paged_activations: {message}", PagerWarning, stacklevel=4)


class RoomMaking:
    """A pager whose restores make room (:meth:`Room.make_room`) and try again while the space
    refuses and something can move; everything else is the upstream pager's."""

    def __init__(self, upstream: Any, room: Room) -> None:
        self.upstream = upstream
        self._room = room

    def __getattr__(self, name: str) -> Any:
        return getattr(self.upstream, name)

    # What a minimal pager may lack, stated once: no counters (the scheduler's estimate stands),
    # no way to tell a value in use (never moved to make room), no figures for messages.
    def moved_bytes(self) -> int | None:
        fn = getattr(self.upstream, "moved_bytes", None)
        return fn() if fn is not None else None

    def in_use(self, handle: Any) -> bool:
        fn = getattr(self.upstream, "in_use", None)
        return fn(handle) if fn is not None else True

    def room(self) -> dict[str, int]:
        fn = getattr(self.upstream, "room", None)
        return fn() if fn is not None else dict(capacity_bytes=0, page_bytes=0, host_pool_capacity_bytes=0,
                                                  host_pool_used_bytes=0)

    def unpack(self, handle: Any) -> Any:
        while True:
            try:
                return self.upstream.unpack(handle)
            except OutOfMemoryError as e:
                nbytes = handle.tensor.untyped_storage().nbytes()
                if not self._room.make_room(nbytes, exclude=handle):
                    raise self._room.no_room(nbytes, e) from e
