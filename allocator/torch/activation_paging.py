"""Paged training activations: saved tensors kept, evicted behind and prefetched ahead, or recomputed.

Owns: the ``saved_tensors_hooks`` context (:class:`PagedActivations`) that hands every tensor
autograd saves to a *pager* (``activation_pagers``), and the schedule it learns from the first
iteration and follows within a byte budget, over records of three kinds (keep, page or
recompute: ``activation_records``).

- Iteration 0 records the order in which saved tensors are packed (forward) and unpacked
  (backward). Later iterations follow it: evict-behind, in forward, once the resident saved
  bytes exceed the budget, offloads the oldest (backward needs them last), walking a queue of
  the tensors that may still hold resident bytes, so a pack costs the same however many came
  before; prefetch-ahead, in backward: each unpack waits for its tensor, then prefetches the
  next ones of the recorded order while they fit in the budget. All on the copy stream.
- If an iteration packs a different sequence of tensors (count, shapes, dtypes), the schedule
  is dropped for that iteration (unpacks restore on demand) and the next one is recorded; if
  only backward unpacked the same tensors in another order, the plan stands, the order is learnt.
- Parameters (or views of one), tensors under ``min_bytes``, not on the pager's device, or
  that the pager has no room for (OutOfMemoryError at pack) are saved as they are.
- Plan (``recompute="auto"``, the default): the recorded iteration notes what made each
  saved tensor and verifies its recipe bit-exact (``activation_replay``,
  ``activation_recorder``); ``activation_plan`` decides per pack index: keep (the tensor
  itself), page (the path above) or recompute (hold only the recipe, bound at pack in later
  iterations once their trace check proved it, ``activation_check``; rebuilt with its segment
  at its first unpack). A tensor saved twice (same tensor, same ``_version``) is packed once
  and its record shared. ``recompute="off"``: keep and page only.
- Budget: an explicit one, or by default what the capacity leaves once the model's own memory,
  measured in the recorded iteration, is counted (``activation_budget``; the recorded
  iteration itself runs with half the capacity).
- Pages are shared between neighbouring allocations (the pager packs small tensors densely) and
  a page moves once every tensor on it has left: until then its bytes stay counted as resident.
  What crossed the link is the space's count (``bytes_paged``); ``activation_room`` makes room.

Layer: torch glue, below ``vtalloc.allocator.torch`` (which re-exports it).
Invariants: a value unpacked is bit-identical to the value packed; a tensor is never
offloaded while autograd holds its unpacked value (unpack makes it resident and it is no
longer counted); every allocation a pager made is freed when autograd drops the saved tensor.
Usage: enter the context around the forward pass of each iteration; run backward after.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any, Callable

from . import shim as _torch_shim
from .activation_pagers import DEFAULT_MIN_BYTES, DevicePager, HostPager, Pager
from .activation_budget import BudgetMeter
from .activation_records import GONE as _GONE, PagedStats, Saved as _Saved
from .activation_replay import Replay
from .activation_hooks import eager_only
from .activation_options import LinkCount, paging_options
from .activation_room import PagerWarning, Room, RoomMaking
from ..activation_plan import KEEP, PAGE, RECOMPUTE, H100, Candidate, CostModel, Plan, plan_activations
from ..errors import InvalidArgumentError, OutOfMemoryError, SourceChangedError
from ..extras import import_torch

__all__ = ["PagedActivations", "PagedStats", "HostPager", "DevicePager", "PagerWarning", "paged_activations"]

ATTR_SAVED = "_vta_saved"  # on a packed tensor: weak reference to its record (a second pack shares it)
DEFAULT_MAX_RECOMPUTE_FRACTION = None  # no cap on recomputed FLOPs: the cost model decides
# Device pages offloaded tensors still hold are unmapped once they pass budget / this (mapped bytes
# stay within budget * 1.25; each release waits once for the streams that may touch those pages).
RELEASE_SLACK_DIVISOR = 4
MAX_REPLANS = 2  # plans dropped because the first iteration after them ran otherwise


class PagedActivations:
    """Context manager around one forward pass; reuse the same object every iteration."""

    def __init__(self, pager: Pager, budget: int | str | None = None, *, capacity_hint: int | None = None,
                 recompute: str = "auto", cost_model: CostModel = H100,
                 max_recompute_fraction: float | None = DEFAULT_MAX_RECOMPUTE_FRACTION) -> None:
        opts = paging_options(budget, capacity_hint, recompute, max_recompute_fraction)
        # The default budget is measured in the recorded iteration (half the capacity until then).
        self._meter: BudgetMeter | None = BudgetMeter(pager, capacity_hint) if opts.measured and capacity_hint is not None else None
        self.budget = opts.budget
        self._room = Room(self)
        self.pager: Any = RoomMaking(pager, self._room)  # its restores make room when the space has none
        self._lock = threading.RLock()
        self._hooks: Any = None
        self._iteration = -1
        self._schedule_packs: list[tuple] | None = None   # signature of each pack, recorded
        self._schedule_unpacks: list[int] | None = None   # pack indices in unpack order, recorded
        self._rec_packs: list[tuple] = []
        self._rec_unpacks: list[int] = []
        self._saved: list[Callable[[], Any]] = []               # this iteration's packed tensors (autograd owns them)
        self._candidates: collections.deque[Callable[[], Any]] = collections.deque()  # may still hold resident bytes
        self._following = False                           # this iteration follows the schedule
        self._reordered = False                           # its backward unpacked in another order (so far)
        self._unpack_pos = 0
        self._resident_bytes = 0                          # packed, not consumed, resident or prefetched
        self._held_bytes = 0                              # offloaded since the last release: device pages may still hold them
        self._release_slack = max(self.budget // RELEASE_SLACK_DIVISOR, 1)
        self._release_at = self._release_slack  # release when _held_bytes passes this
        self._counts = dict(iterations=0, scheduled_iterations=0, fallback_iterations=0, reordered_iterations=0, packed=0, packed_bytes=0,
                            passed_through=0, passed_through_no_room=0, offloads=0, releases=0, release_waits=0,
                            prefetches=0, on_demand=0, shared=0, kept_bytes=0, bytes_paged=0, bytes_recomputed=0,
                            recompute_flops=0, recompute_fallbacks=0, recompute_diverged=0, checked_ops=0, replans=0,
                            host_pool_full=0, room_offloads=0)
        self._step = dict.fromkeys(("kept_bytes", "bytes_paged", "bytes_recomputed", "recompute_flops",
                                    "checked_ops"), 0)
        self._peak = 0                                    # most resident saved bytes this iteration
        self._since_plan = 0                              # iterations run under the current plan
        self._wait_s = 0.0
        self._link = LinkCount(self.pager.moved_bytes)  # what crossed the link, by the space's counters
        self.recompute = opts.recompute
        self.cost_model = cost_model
        self._replay = Replay(self)                       # the recompute side: recorder, templates, verification
        self._rec_cands: list[Candidate] = []             # the recording iteration's packs, for the planner
        self._plan: Plan | None = None
        self._measuring = False
        self.max_recompute_fraction = opts.max_recompute_fraction

    # -- context ---------------------------------------------------------------------------
    def __enter__(self) -> "PagedActivations":
        torch = import_torch()

        with self._lock:
            self._finish_recording()
            self._iteration += 1
            self._counts["iterations"] += 1
            self._saved = []
            self._candidates = collections.deque()
            self._rec_packs, self._rec_unpacks = [], []
            self._following = self._schedule_packs is not None
            if self._following:
                self._counts["scheduled_iterations"] += 1
            self._unpack_pos = 0
            self._reordered = False
            self._since_plan = self._since_plan + 1 if self._plan is not None else 0
            self._resident_bytes = self._peak = 0
            self._rec_cands = []
            self._measuring = self._plan is None  # no plan to follow: note what the planner needs
            self._step = dict.fromkeys(self._step, 0)
            self._link.new_step()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(eager_only(self._pack), eager_only(self._unpack))
        self._hooks.__enter__()
        # The recorder (a Python call per operation) runs only where a plan is made.
        self._replay.start(record=self._measuring and self.recompute == "auto")
        if self._measuring and self._meter is not None:
            self._meter.begin()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._replay.stop(*exc)
        self._hooks.__exit__(*exc)
        self._hooks = None
        with self._lock:
            if self._following and self._schedule_packs is not None and len(self._rec_packs) != len(self._schedule_packs):
                self._fall_back()
            if self._since_plan == 1 and self._replay.diverged and self._counts["replans"] < MAX_REPLANS:
                # The first iteration after the plan ran otherwise than the recorded one (which may
                # have been a warm-up): record the next one and plan again (a few times at most: a
                # model that alternates paths keeps its plan, and pages where the check refuses).
                self._plan = None
                self._counts["replans"] += 1
        if exc[0] is None:
            self._room.check_forward()  # a backward that cannot fit fails here, not halfway through

    def stats(self) -> PagedStats:
        with self._lock:
            counts, step = dict(self._counts), dict(self._step)
            moved = self._link.since()  # what really crossed the link, not the saved tensors' sizes
            if moved is not None:
                counts["bytes_paged"], step["bytes_paged"] = moved
            return PagedStats(**counts, unpack_wait_s=self._wait_s, budget_bytes=self.budget,
                              backward_held_bytes=self._room.need, step_peak_resident_bytes=self._peak,
                              **{f"step_{k}": v for k, v in step.items()})

    def plan(self) -> Plan | None:
        """The plan the iterations after the recorded one follow (None until one was recorded):
        per pack index its bytes, operation, decision and modelled cost, and a summary. Printable."""
        with self._lock:
            if self._plan is None and self._measuring and self._rec_cands:
                return self._make_plan()
            return self._plan

    def _make_plan(self, budget: int | None = None) -> Plan:
        frac, r = self.max_recompute_fraction, self._replay
        return plan_activations(self._rec_cands, self.budget if budget is None else budget, self.cost_model,
                                allow_recompute=self.recompute == "auto",
                                max_recompute_flops=None if frac is None else int(r.forward_flops * frac),
                                unpack_order=self._rec_unpacks, forward=r.forward)

    def _hold(self, n: int) -> None:
        """Resident saved bytes change by ``n`` (under the lock)."""
        self._resident_bytes += n
        self._peak = max(self._peak, self._resident_bytes)

    def _count(self, key: str, n: int) -> None:
        self._counts[key] += n
        self._step[key] += n

    # -- schedule bookkeeping ----------------------------------------------------------------
    def _finish_recording(self) -> None:
        """At the start of an iteration: adopt the previous one's order if it was recorded."""
        if self._iteration < 0:
            return
        if self._following and self._reordered:  # the same tensors unpacked in another order (a compiled
            # backward, otherwise than under the recorder's mode): the plan stands, the order is learnt
            if collections.Counter(self._rec_unpacks) == collections.Counter(self._schedule_unpacks or ()):
                self._schedule_unpacks = list(self._rec_unpacks)
                self._counts["reordered_iterations"] += 1
            else:
                self._fall_back()
        if not self._following:  # recorded (first iteration, or after a change): becomes the schedule
            self._schedule_packs = list(self._rec_packs)
            self._schedule_unpacks = list(self._rec_unpacks)
        if self._measuring and len(self._rec_cands) == len(self._rec_packs):
            self.budget, self._plan = (self._meter.settle(self.budget, self._make_plan) if self._meter is not None
                                       else (self.budget, self._make_plan()))
            self._release_at = max(self.budget // RELEASE_SLACK_DIVISOR, 1)
            self._replay.adopt([r.index for r in self._plan.rows if r.decision == RECOMPUTE], self._rec_unpacks)

    def _fall_back(self) -> None:
        if self._following:
            self._following = False
            self._counts["fallback_iterations"] += 1
            self._plan = None  # the next iteration follows a plan made from this one

    # -- hooks -----------------------------------------------------------------------------
    @staticmethod
    def _is_parameter(tensor: Any) -> bool:
        base = tensor._base if tensor._base is not None else tensor
        return base.is_leaf and base.requires_grad  # a parameter, or a view of one (Linear saves weight.t())

    def _pack(self, tensor: Any) -> Any:
        with self._replay.packing():  # the pager's own work out of the dispatch modes' sight
            return self._pack_one(tensor)

    def _pack_one(self, tensor: Any) -> Any:
        if self._is_parameter(tensor) or not self.pager.accepts(tensor):
            with self._lock:
                self._counts["passed_through"] += 1
            return tensor
        signature = (tuple(tensor.shape), tensor.dtype)
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            index = len(self._saved)
            prev = getattr(tensor, ATTR_SAVED, None)
            prev = prev() if prev is not None else None
            if (prev is not None and prev.iteration == self._iteration and prev.version == tensor._version
                    and prev.state != "consumed"):
                # Saved twice (ReLU(inplace=True)'s result and the next layer's input): one record.
                self._record_pack(index, signature)
                self._saved.append(self._saved[prev.index])
                self._counts["shared"] += 1
                if self._measuring:
                    self._rec_cands.append(Candidate(index, 0, "", shared_with=prev.index))
                return prev
            decision = self._plan.decision(index) if (self._plan is not None and self._following) else PAGE
        recipe = None
        if decision == RECOMPUTE:
            # Bound to this iteration's records and run now: used only if it reproduces the tensor.
            recipe, why = self._replay.bind(tensor, index)
            if recipe is None:
                decision = PAGE
                with self._lock:
                    self._counts["recompute_fallbacks"] += 1
                    self._counts["recompute_diverged"] += why.startswith("diverged")
        if decision == KEEP:
            saved = _Saved(tensor, nbytes, index, self._iteration, kind=KEEP, version=tensor._version)
        elif decision == RECOMPUTE:
            saved = _Saved(recipe, nbytes, index, self._iteration, kind=RECOMPUTE, version=tensor._version)
            self._replay.recomputed(saved)
            nbytes = 0  # holds no bytes
        else:
            try:
                handle, nbytes = self._pack_copy(tensor, nbytes)
            except OutOfMemoryError:
                # No room in the space for it even after moving out everything that may move (larger
                # than the space, or the rest in use): autograd keeps it as it would without the
                # pager, beyond the budget (counted, warned once). Training goes on; the order of
                # packs (the schedule) is the same whether it was paged or not.
                self._room.no_room_at_pack(nbytes)
                with self._lock:
                    self._counts["passed_through"] += 1
                    self._counts["passed_through_no_room"] += 1
                    self._record_pack(index, signature)
                    self._saved.append(_GONE)
                    if self._measuring:
                        self._rec_cands.append(Candidate(index, 0, "no room"))
                return tensor
            saved = _Saved(handle, nbytes, index, self._iteration, version=tensor._version)
        try:
            setattr(tensor, ATTR_SAVED, weakref.ref(saved))
        except (AttributeError, RuntimeError):
            pass
        with self._lock:
            self._saved.append(weakref.ref(saved))
            self._record_pack(index, signature)
            self._counts["packed"] += 1
            self._counts["packed_bytes"] += nbytes
            if decision == KEEP:
                self._count("kept_bytes", nbytes)
            self._hold(nbytes)
            if decision == PAGE:
                self._candidates.append(self._saved[-1])
        self._replay.packed(index, tensor)
        if self._measuring:
            if self._meter is not None:
                self._meter.sample(self._resident_bytes, nbytes)
            # Before evict-behind: its sources are likely still resident.
            cand = self._replay.note(tensor, saved)
            with self._lock:
                self._rec_cands.append(cand)
        if decision in (PAGE, KEEP):
            # A kept tensor counts against the budget too: the plan keeps the newest, packed after
            # the last paged one, so its pack must push paged ones out (it is no candidate itself).
            with self._lock:
                self._evict_behind(spare_newest=decision == PAGE)
        return saved

    def _pack_copy(self, tensor: Any, nbytes: int) -> tuple[Any, int]:
        """The pager's pack; when the space has no room, make some and try again while something moves."""
        while True:
            try:
                return self.pager.pack(tensor)
            except OutOfMemoryError:
                if not self._room.make_room(nbytes):
                    raise

    # -- records ----------------------------------------------------------------------------
    def _record_at(self, index: int) -> Any:
        """This iteration's record at pack ``index``, if it still holds its value."""
        with self._lock:
            s = self._saved[index]() if 0 <= index < len(self._saved) else None
        return s if s is not None and s.iteration == self._iteration and s.state != "consumed" else None

    def _came_back(self, s: _Saved) -> int:
        """Bookkeeping of a paged record made resident now; -> bytes that crossed the link back."""
        if s.state == "offloaded":
            back = s.nbytes - s.kept
            self._hold(back)
            s.state, s.kept = "resident", 0
            if self._hooks is not None:  # in forward: evict-behind may move it again
                self._candidates.appendleft(self._saved[s.index])
            return back
        return 0

    def _record_pack(self, index: int, signature: tuple) -> None:
        self._rec_packs.append(signature)
        if self._following:
            sched = self._schedule_packs or []
            if index >= len(sched) or sched[index] != signature:
                self._fall_back()

    def _evict_behind(self, spare_newest: bool = True) -> None:
        # Oldest first (backward needs them last). The queue holds packed tensors that may still
        # hold resident bytes, in pack order; one gone, consumed or wholly away leaves it for good
        # (a pass costs what it offloads, not the number saved). One offloaded in part (a page
        # shared with a tensor that may not move) stays until that page can move. The newest one
        # is not offloaded by the pack that saved it.
        queue = self._candidates
        newest = queue[-1] if queue and spare_newest else None
        stuck: list[Callable[[], Any]] = []
        while queue and self._resident_bytes > self.budget:
            ref = queue[0]
            if ref is newest:
                break
            s = ref()
            if s is None or not (s.state == "resident" or (s.state == "offloaded" and s.kept)):
                queue.popleft()
                continue
            try:
                self._offload_record(s)
            except MemoryError:
                self._room.host_pool_full()  # counted and warned: it stays resident, beyond the budget
                break
            queue.popleft()
            if s.state != "offloaded" or s.kept:
                stuck.append(ref)  # pages of it are shared with something that cannot move (yet)
        # What could not move (yet) goes back to the front, in pack order, for the next pass.
        queue.extendleft(reversed(stuck))
        if self._held_bytes > self._release_at:
            self._room.release_held()

    def _offload_record(self, s: _Saved) -> int:
        """Offload one paged record (lock held) and keep its bookkeeping; -> bytes of it newly away.
        A record whose every page is shared with something that may not move stays as it was (0).
        MemoryError (the host pool is full) goes to the caller."""
        try:
            moved = self.pager.offload(s.handle)
        except InvalidArgumentError:
            return 0
        away = s.nbytes if moved is None else min(moved, s.nbytes)
        if s.state == "consumed":  # finished with (a retained graph): not counted as resident any more
            return away
        was_away = s.nbytes - s.kept if s.state == "offloaded" else 0
        if s.state in ("resident", "prefetched"):
            self._counts["offloads"] += 1
        s.state = "offloaded"
        s.kept = s.nbytes - away
        self._resident_bytes -= away - was_away
        self._held_bytes += away - was_away
        return max(away - was_away, 0)

    def _unpack(self, saved: Any) -> Any:
        if not isinstance(saved, _Saved):
            return saved  # passed through at pack time
        on_demand = False
        if self._measuring and self._meter is not None:
            with self._lock:
                self._meter.sample(self._resident_bytes)
        t0 = time.perf_counter()
        if saved.kind == KEEP:
            if saved.handle._version != saved.version:
                raise SourceChangedError(
                    "a saved tensor kept as it was was changed in place after it was saved (autograd refuses that too)")
            tensor = saved.handle
        elif saved.kind == RECOMPUTE:
            tensor = self._replay.unpack(saved)  # rebuilt with its segment, or held since its segment ran
        else:
            with self._lock:
                on_demand = saved.state == "offloaded" and not self.pager.is_resident(saved.handle)
                back = saved.nbytes - saved.kept if saved.state == "offloaded" else 0
            tensor = self.pager.unpack(saved.handle)  # makes room if it must; an error leaves no trace here
            with self._lock:
                self._count("bytes_paged", back)
                self._room.lent_out(saved)
        waited = time.perf_counter() - t0
        with self._lock:
            if on_demand:
                self._counts["on_demand"] += 1
            if saved.iteration == self._iteration:
                self._rec_unpacks.append(saved.index)
                if self._following:
                    expect = self._schedule_unpacks or []
                    pos = self._unpack_pos
                    if pos >= len(expect) or expect[pos] != saved.index:
                        self._reordered = True  # judged at the next iteration: reordered, or ran otherwise
                    self._unpack_pos += 1
            self._wait_s += waited
            if saved.state in ("resident", "prefetched"):
                self._resident_bytes -= saved.nbytes if saved.kind != RECOMPUTE else 0
            elif saved.state == "offloaded":
                self._resident_bytes -= saved.kept  # the part that never left
            saved.state = "consumed"
            if self._following and not self._reordered and saved.iteration == self._iteration:
                self._prefetch_ahead()
        return tensor

    def _prefetch_ahead(self) -> None:
        order = self._schedule_unpacks or []
        for pos in range(self._unpack_pos, len(order)):
            idx = order[pos]
            if idx >= len(self._saved):
                break
            s = self._saved[idx]()
            if s is not None and s.state == "offloaded":
                back = s.nbytes - s.kept  # what left comes back
                if self._resident_bytes + back > self.budget:
                    break
                try:
                    self.pager.prefetch(s.handle)
                except OutOfMemoryError:
                    break  # no room now; its unpack will restore on demand
                s.state = "prefetched"
                self._hold(back)
                self._count("bytes_paged", back)
                self._counts["prefetches"] += 1


def paged_activations(
    space: Any = None, budget: int | str | None = None, *, min_bytes: int = DEFAULT_MIN_BYTES,
    recompute: str = "auto", cost_model: CostModel = H100,
    max_recompute_fraction: float | None = DEFAULT_MAX_RECOMPUTE_FRACTION,
) -> PagedActivations:
    """Page the activations autograd saves within ``budget`` resident bytes.

    ``space=None`` pages torch's own CUDA tensors in place (vtalloc must be torch's allocator
    through ``enable(evict_mode="mapped")``); on CPU, pass a host-backend
    :class:`AddressSpace`: saved CPU tensors are copied into it on pack and paged there.
    ``budget`` defaults to what the capacity leaves once the model's own memory (parameters,
    gradients, optimizer state, workspace), measured in the first iteration, is counted; an
    explicit budget wins. Use one object for every iteration (it learns the order in the first)::

        pager = paged_activations(space, budget="64MiB")
        for x, y in data:
            with pager:
                loss = loss_fn(model(x), y)
            loss.backward()

    ``recompute="auto"`` (the default) plans, from the first iteration, which saved tensors to
    keep as they are, page out or recompute at unpack, whole segments at once (bit-exact, proven;
    see docs/activation-plan.md and :meth:`PagedActivations.plan`); ``"off"`` only keeps and
    pages. ``max_recompute_fraction`` caps the FLOPs recomputed per step, as a share of the
    recorded forward's (default None: the cost model decides).
    """
    if space is None:
        pager = DevicePager(min_bytes=min_bytes)
        devices = _torch_shim.devices()
        hint = _torch_shim.device_stats(devices[0]).capacity_bytes if devices else None
        return PagedActivations(pager, budget, capacity_hint=hint, recompute=recompute, cost_model=cost_model,
                                max_recompute_fraction=max_recompute_fraction)
    return PagedActivations(HostPager(space, min_bytes=min_bytes), budget, capacity_hint=space.capacity_bytes,
                            recompute=recompute, cost_model=cost_model, max_recompute_fraction=max_recompute_fraction)
