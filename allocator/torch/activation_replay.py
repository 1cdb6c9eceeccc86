"""The recompute side of ``paged_activations``: recipes from the recorded iteration to the later ones.

Owns: for one :class:`~.activation_paging.PagedActivations`, the life of its dispatch modes
(the recorder in a recorded iteration, the trace check in the later ones), the planner's view
of each pack of the recorded iteration (its recipe compiled, run and compared bit for bit at
pack, its template kept, or why it has none), binding a planned template to a later
iteration's records at pack once the trace check proved it, and the run of a *segment* at
unpack: the first unpack of a recomputed tensor rebuilds it and every recomputed tensor it
needs that no unpack rebuilt yet, each once, in pack order; the others are held (``cache``)
until backward unpacks them and no recomputed reader still has to read them.

Why a later iteration does not run a recipe at pack: the recorded iteration ran every recipe
and compared it bit for bit; what a later one must prove is that it ran the same operations
on the same inputs, which the trace check sees in its forward (``activation_check``). A recipe
it cannot prove (another operation, other arguments, another source) is not used: the tensor
is paged (``recompute_fallbacks``, ``recompute_diverged``).
Invariants: a recipe is used only where it reproduced its tensor bit for bit in the recorded
iteration and the trace check proved it in this one; a random operation is replayed from the
state noted before it ran in the same iteration; every borrowed source is released after the
run (unless autograd took it meanwhile); a held segment value counts as resident saved bytes
until its last unpack.
"""

from __future__ import annotations

import collections
import contextlib
import weakref
from typing import Any

from ..activation_costs import check_windows
from ..activation_plan import KEEP, RECOMPUTE, Candidate, Forward
from ..errors import SourceChangedError

__all__ = ["Replay"]


class Replay:
    """The recompute side of one pager (module docstring). ``sched`` is the scheduler: its lock,
    pager, cost model, counters, this iteration's records and the bookkeeping of a record brought back."""

    def __init__(self, sched: Any) -> None:
        self.sched = sched
        self.recorder: Any = None                    # the recorded iteration's mode
        self.check: Any = None                       # a later iteration's trace check
        self.boundaries: Any = None                  # the recorded iteration's module boundaries
        self.windows: Any = None                     # where the plan's trace check opens and closes
        self.spec: Any = None                        # what the check must see (None: the plan recomputes nothing)
        self.forward = Forward()                     # the recorded forward, priced on the cost model
        self.forward_flops = 0                       # its FLOPs as torch's flop counter counts them
        self.calls: list = []                        # the recorded iteration's calls, until a plan is adopted
        self.costs: list = []                        # its operations' (FLOPs, bytes touched), by position
        self.rec_templates: dict[int, Any] = {}      # recorded iteration: pack index -> verified template
        self.templates: dict[int, Any] = {}          # the plan's: pack index -> template
        self._leaves: set[int] = set()               # pack indices the plan's templates read
        self.diverged = False                        # the latest checked iteration ran otherwise than recorded
        self._refused = 0
        self._uses: collections.Counter = collections.Counter()     # recorded unpacks per pack index
        self._readers: collections.Counter = collections.Counter()  # the plan's recomputed readers per pack index
        self._siblings: dict[int, tuple] = {}        # pack index -> others the same operation made (its other outputs)

    # -- iteration ---------------------------------------------------------------------------
    def start(self, record: bool) -> None:
        """At the context's entry: the recorder if this iteration is recorded, else the trace
        check if the plan recomputes anything."""
        self.diverged = False
        if record:
            from .activation_recorder import Recorder

            from .activation_windows import Boundaries

            self.rec_templates = {}
            self.recorder = Recorder(self.sched.cost_model)
            self.boundaries = Boundaries(lambda: len(self.recorder.calls)).__enter__()
            self.recorder.__enter__()
        elif self.spec is not None:
            from .activation_check import TraceCheck

            self._refused = 0
            self.check = TraceCheck(self.spec)
            if self.windows is None or self.windows.at_start:
                self.check.open(0)
            if self.windows is not None:
                self.windows.begin(self.check)

    def stop(self, *exc: Any) -> None:
        if self.recorder is not None:
            r = self.recorder
            r.__exit__(*exc)
            self.boundaries.__exit__(*exc)
            ops = len(r.calls)
            self.forward = Forward(ops, r.clock_s, r.device_s, ops * self.sched.cost_model.launch_s, r.flops,
                                   edges=self.boundaries.edges)
            self.forward_flops = r.formula_flops
            self.calls, self.costs = r.calls, r.costs
            self.recorder = None
        if self.check is not None:
            if self.windows is not None:
                self.windows.end()
            if self.check.active:
                self.check.__exit__(*exc)  # the innermost mode: the pager's context is the outermost
            self.diverged = self._refused > 0 or self.check.mismatch
            with self.sched._lock:
                self.sched._count("checked_ops", self.check.checked)
            self.check = None

    def adopt(self, indices: Any, unpacks: Any) -> None:
        """The plan was made from the recorded iteration: keep the templates of the tensors it
        recomputes, what the trace check must see for them, how often backward unpacked each
        (``unpacks``: pack indices in unpack order) and how many of them read each."""
        from .activation_check import TraceSpec

        self.templates = {i: self.rec_templates[i] for i in indices if i in self.rec_templates}
        self._uses = collections.Counter(unpacks)
        self._readers = collections.Counter(j for t in self.templates.values()
                                            for j in {e[1] for e in t.prog if e[0] == "saved"})
        by_top: dict[int, list[int]] = collections.defaultdict(list)
        for i, t in self.templates.items():
            by_top[t.top[0]].append(i)
        self._siblings = {i: tuple(j for j in by_top[t.top[0]] if j != i) for i, t in self.templates.items()}
        self.spec = TraceSpec.of(self.calls, self.templates.values()) if self.templates else None
        if self.windows is not None:
            self.windows.remove()
            self.windows = None
        if self.templates and self.boundaries is not None and self.forward.edges:
            from .activation_windows import Windows

            model = self.sched.cost_model
            wins = check_windows([t.span() for t in self.templates.values()], self.forward.edges, self.forward.ops,
                                 model.window_join_ops())
            self.windows = Windows(wins, self.boundaries.events, self.forward.ops)
            weakref.finalize(self, self.windows.remove)
        self.boundaries = None
        self._leaves = {e[1] for t in self.templates.values() for e in t.prog if e[0] == "saved"}
        self.calls = []

    def packing(self) -> Any:
        """At every pack hook call, first: keeps the pager's own work (copies into the space,
        verification) out of the modes' sight."""
        if self.recorder is not None or (self.check is not None and self.check.active):
            from torch.utils._python_dispatch import _disable_current_modes

            return _disable_current_modes()
        return contextlib.nullcontext()

    def recomputed(self, saved: Any) -> None:
        """A record the plan recomputes was packed: its unpacks and readers to come."""
        saved.uses = max(self._uses.get(saved.index, 1), 1)
        saved.readers = self._readers.get(saved.index, 0)

    def packed(self, index: int, tensor: Any) -> None:
        """Pack ``index`` took ``tensor``: the trace check notes it where a recipe reads it."""
        if self.check is not None and index in self._leaves:
            self.check.packed(index, tensor)

    # -- the recorded iteration --------------------------------------------------------------
    def note(self, tensor: Any, saved: Any) -> Candidate:
        """The planner's row for this pack, with its recipe verified bit-exact now."""
        from .activation_recompute import bitwise_equal, compile_recipe
        from .activation_recorder import external_node, node_of

        node = node_of(tensor)
        if node is None and self.recorder is not None:
            # Autograd saves an operation's inputs before the operation runs: an input made outside
            # the forward (the batch, token ids) is packed before the recorder first sees it.
            node = external_node(tensor)
        if node is not None:
            node.saved = weakref.ref(saved)  # a later recipe may read this value from the record
            node.index = saved.index
        why: list[str] = []
        recipe = template = None
        if self.sched.recompute == "auto" and self.recorder is not None:
            recipe = compile_recipe(tensor, self._record_of, why)
            if recipe is not None:
                try:
                    ok = bitwise_equal(self.run(recipe, None), tensor)
                    if not ok:
                        why.append("not bit-exact when run again")
                except Exception as e:  # noqa: BLE001 - whatever fails to recompute is simply not planned
                    ok = False
                    why.append(f"raised {type(e).__name__} when run again")
                template = recipe.template(self.recorder.calls) if ok else None
        else:
            why.append('recompute="off"')
        if template is not None:
            self.rec_templates[saved.index] = template
        op = recipe.op if recipe is not None else (getattr(getattr(node, "func", None), "__name__", "") if node else "")
        r = recipe if template is not None else None
        at = self.recorder.clock_s if self.recorder is not None else 0.0
        at_op = len(self.recorder.calls) if self.recorder is not None else 0
        return Candidate(saved.index, saved.nbytes, op, recomputable=r is not None,
                         flops=r.flops if r else 0, touched=r.touched if r else 0, ops=r.ops if r else 1,
                         sources=tuple(s.index for s in r.sources()) if r else (), why="" if r else why[0], at_s=at,
                         at_op=at_op,
                         group=template.top[0] if template is not None and r is not None and r.shares() else -1,
                         span=template.span() if template is not None else None)

    def _record_of(self, node: Any) -> Any:
        s = node.saved() if node.saved is not None else None
        return s if s is not None and s.iteration == self.sched._iteration and s.version == node.version else None

    # -- later iterations --------------------------------------------------------------------
    def bind(self, tensor: Any, index: int) -> tuple[Any, str]:
        """The plan's recipe for pack ``index`` bound to this iteration, once the trace check
        proved it ran as recorded on the same inputs; (None, why) if not ("diverged: ..." where
        the iteration ran otherwise)."""
        template = self.templates.get(index)
        if template is None or self.check is None:
            return None, "no template"
        recipe, why = template.bind(self.sched._record_at, self.check.rng_at)
        if recipe is None:
            return None, why
        why = self.check.proves(template, tensor)
        if why:
            self._refused += 1
            self.readers_gone(recipe)  # paged instead: it will read none of its sources
            return None, f"diverged: {why}"
        return recipe, ""

    def unpack(self, saved: Any) -> Any:
        """A recomputed record's value: held since its segment's run, or rebuilt now with its segment."""
        value = saved.cache
        if value is None and saved.value is not None:
            value = saved.value()  # a second unpack: the value autograd still holds
        if value is None:
            value = self._segment(saved)
        saved.uses -= 1
        self._settle(saved, value)
        saved.value = weakref.ref(value)
        return value

    def _settle(self, rec: Any, value: Any = None) -> None:
        """Hold a recomputed value while backward will unpack it or a recomputed reader still
        has to read it; let it go after."""
        keep = rec.uses > 0 or rec.readers > 0
        with self.sched._lock:
            if keep and rec.cache is None and value is not None:
                rec.cache = value
                self.sched._hold(rec.nbytes)
            elif not keep and rec.cache is not None:
                rec.cache = None
                self.sched._hold(-rec.nbytes)

    def readers_gone(self, recipe: Any) -> None:
        """``recipe`` ran (or will never run): its recomputed sources have one reader less."""
        for src in recipe.sources():
            if src.kind == RECOMPUTE:
                src.readers -= 1
                self._settle(src)

    def _segment(self, target: Any) -> Any:
        """Rebuild ``target`` and the recomputed records it needs that hold no value, each once,
        sources first, with the other outputs of the operations they end in (still to be
        unpacked: siblings); those still to be unpacked (or read) are held until then."""
        need, todo, seen = [], [target], {id(target)}

        def wanted(rec: Any) -> bool:
            return rec.kind == RECOMPUTE and id(rec) not in seen and rec.cache is None \
                and (rec.value is None or rec.value() is None)

        while todo:
            rec = todo.pop()
            need.append(rec)
            sibs = [self.sched._record_at(j) for j in self._siblings.get(rec.index, ())]
            for src in list(rec.handle.sources()) + [r for r in sibs if r is not None and r.uses > 0]:
                if wanted(src):
                    seen.add(id(src))
                    todo.append(src)
        need.sort(key=lambda r: r.index)
        values: dict[int, Any] = {}
        memo: dict[int, Any] = {}
        for rec in need:
            values[id(rec)] = v = self.run(rec.handle, values=values, memo=memo)
            if rec is not target:
                self._settle(rec, v)
        for rec in need:
            self.readers_gone(rec.handle)
        return values[id(target)]

    # -- running -----------------------------------------------------------------------------
    def run(self, recipe: Any, flops_key: str | None = "recompute_flops", values: dict | None = None,
            memo: dict | None = None) -> Any:
        """Run a recipe, borrowing its saved sources (resident and not evictable while read).
        ``flops_key``: the counter its FLOPs go to (None: not counted, the recorded iteration's
        check); an unpack (``recompute_flops``) also counts the bytes it made. ``values``: the
        segment's values made so far (by record); ``memo``: its operations' results by position
        (a result found there is not run, nor counted, again)."""
        s = self.sched
        borrowed: list[Any] = []

        def value_of(src: Any) -> Any:
            if src.kind == RECOMPUTE:
                v = src.cache
                if v is None and src.value is not None:
                    v = src.value()
                if v is None and values is not None:
                    v = values.get(id(src))
                return v if v is not None else self.run(src.handle, flops_key, values)
            if src.kind == KEEP:
                if src.handle._version != src.version:
                    raise SourceChangedError("a saved tensor a recompute reads was changed in place after it was saved")
                return src.handle
            if s.pager.value_changed(src.handle, src.version):
                raise SourceChangedError("a saved tensor a recompute reads was changed in place after it was saved")
            with s._lock:
                back = s._came_back(src)
            value = s.pager.unpack(src.handle)
            if src.state != "consumed":
                borrowed.append(src)
                with s._lock:
                    s._count("bytes_paged", back)
            return value

        memo = memo if memo is not None and recipe.shares() else None
        fresh = [e[6] for e in recipe.prog if e[0] == "op" and (memo is None or e[6] not in memo)]
        flops = recipe.flops if memo is None else sum(recipe.flops_at.get(p, 0) for p in set(fresh))
        try:
            value = recipe.run(value_of, memo)
        finally:
            for src in borrowed:
                if src.state != "consumed":
                    s.pager.release(src.handle)
        if flops_key is not None:
            with s._lock:
                s._count(flops_key, flops)
                if flops_key == "recompute_flops":
                    s._count("bytes_recomputed", value.numel() * value.element_size())
        return value
