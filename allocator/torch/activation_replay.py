"""The recompute side of ``paged_activations``: recipes from the recorded iteration to the later ones.

Owns: for one :class:`~.activation_paging.PagedActivations`, the recorder's life (it runs only
in a recorded iteration), the planner's view of each pack of that iteration (its recipe
compiled, run and compared bit for bit at pack, its template kept, or why it has none), the
RNG states later iterations capture at the points the plan's random operations start from,
binding a planned template to a later iteration's records at pack and verifying it there, and
running a recipe with its saved sources borrowed (resident and not evictable while read).

Why later iterations verify at pack: they run without the recorder (no Python call per
operation), so nothing records how they computed a tensor. A recipe bound to this iteration's
saved tensors, parameters and RNG states is correct for this iteration exactly when it
reproduces the tensor, so it is run once at pack, while the tensor is still at hand, and
compared bit for bit; a recipe that does not reproduce it (the iteration took another path:
other operations, other arguments, a random draw in between) is not used and the tensor is
paged (``recompute_fallbacks``, ``recompute_diverged``). Identities and versions of the
sources alone would not do: they do not say which operation ran on them. The cost is one more
run of each recomputed recipe per step (``verify_flops``), which the plan counts against the
recompute cap.
Invariants: a recipe is used only after it reproduced its tensor bit for bit in the same
iteration; a random operation is replayed from a state captured in the same iteration; every
borrowed source is released after the run (unless autograd took it meanwhile).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from ..activation_plan import KEEP, RECOMPUTE, Candidate
from ..errors import SourceChangedError

__all__ = ["Replay"]


class Replay:
    """The recompute side of one pager (module docstring). ``sched`` is the scheduler: its lock,
    pager, counters, this iteration's records and the bookkeeping of a record brought back."""

    def __init__(self, sched: Any) -> None:
        self.sched = sched
        self.recorder: Any = None
        self.forward_flops = 0                       # FLOPs of the recorded forward (FlopCounterMode's count)
        self.rec_templates: dict[int, Any] = {}      # recorded iteration: pack index -> verified template
        self.templates: dict[int, Any] = {}          # the plan's: pack index -> template
        self._points: dict[int, list[tuple]] = {}    # capture point -> [(point, kind, index)] the plan needs
        self._states: dict[tuple, Any] = {}          # this iteration's captured RNG states
        self.calls = 0                               # pack hook calls this iteration (the capture points)

    # -- iteration ---------------------------------------------------------------------------
    def start(self, record: bool) -> None:
        """At the context's entry: the recorder if this iteration is recorded, else the RNG state at point 0."""
        self.calls = 0
        self._states = {}
        self.rec_templates = {}
        if record:
            from .activation_recorder import Recorder

            self.recorder = Recorder()
            self.recorder.__enter__()
        else:
            self._capture(0)

    def stop(self, *exc: Any) -> None:
        if self.recorder is not None:
            self.recorder.__exit__(*exc)
            # The cap's base: the forward's FLOPs as torch's flop counter counts them. The
            # elementwise operations it counts as 0 (one per element in the recorder) would
            # raise the cap above 5% of that (a Llama decoder recomputed 5.5%).
            self.forward_flops = self.recorder.formula_flops
            self.recorder = None

    def adopt(self, indices: Any) -> None:
        """The plan was made from the recorded iteration: keep the templates of the tensors it recomputes."""
        self.templates = {i: self.rec_templates[i] for i in indices if i in self.rec_templates}
        self._points = {}
        for t in self.templates.values():
            for p in t.points():
                self._points.setdefault(p[0], []).append(p)

    def packing(self) -> Any:
        """At every pack hook call, first: a capture point. Returns a context that keeps the
        pager's own work (copies into the space, verification) out of the recorder's sight."""
        self.calls += 1
        if self.recorder is not None:
            self.recorder.mark(self.calls)
            from torch.utils._python_dispatch import _disable_current_modes

            return _disable_current_modes()
        self._capture(self.calls)
        return contextlib.nullcontext()

    def _capture(self, point: int) -> None:
        needed = self._points.get(point)
        if needed:
            from .activation_recorder import rng_state

            for p in needed:
                self._states[p] = rng_state((p[1], p[2]))

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
        why: list[str] = []
        recipe = template = None
        if self.sched.recompute == "auto":
            recipe = compile_recipe(tensor, self._record_of, why)
            if recipe is not None:
                try:
                    ok = bitwise_equal(self.run(recipe, None), tensor)
                    if not ok:
                        why.append("not bit-exact when run again")
                except Exception as e:  # noqa: BLE001 - whatever fails to recompute is simply not planned
                    ok = False
                    why.append(f"raised {type(e).__name__} when run again")
                template = recipe.template(why) if ok else None
        else:
            why.append('recompute="off"')
        if template is not None:
            self.rec_templates[saved.index] = template
        op = recipe.op if recipe is not None else (getattr(getattr(node, "func", None), "__name__", "") if node else "")
        r = recipe if template is not None else None
        return Candidate(saved.index, saved.nbytes, op, recomputable=r is not None,
                         flops=r.flops if r else 0, touched=r.touched if r else 0, ops=r.ops if r else 1,
                         sources=tuple(s.index for s in r.sources()) if r else (), why="" if r else why[0])

    def _record_of(self, node: Any) -> Any:
        s = node.saved() if node.saved is not None else None
        return s if s is not None and s.iteration == self.sched._iteration and s.version == node.version else None

    # -- later iterations --------------------------------------------------------------------
    def bind(self, tensor: Any, index: int) -> tuple[Any, str]:
        """The plan's recipe for pack ``index`` bound to this iteration and verified against
        ``tensor`` now; (None, why) if it cannot be bound or does not reproduce the tensor."""
        from .activation_recompute import bitwise_equal

        template = self.templates.get(index)
        if template is None:
            return None, "no template"
        recipe, why = template.bind(self.sched._record_at, self._states.get)
        if recipe is None:
            return None, why
        try:
            same = bitwise_equal(self.run(recipe, "verify_flops"), tensor)
        except SourceChangedError:
            return None, "a source changed"
        except Exception as e:  # noqa: BLE001 - a recipe that fails here is not used
            return None, f"raised {type(e).__name__}"
        return (recipe, "") if same else (None, "diverged")

    # -- running -----------------------------------------------------------------------------
    def run(self, recipe: Any, flops_key: str | None = "recompute_flops") -> Any:
        """Run a recipe, borrowing its saved sources (resident and not evictable while read).
        ``flops_key``: the counter its FLOPs go to (None: not counted, the recorded iteration's
        check); an unpack (``recompute_flops``) also counts the bytes it made."""
        s = self.sched
        borrowed: list[Any] = []

        def value_of(src: Any) -> Any:
            if src.kind == RECOMPUTE:
                v = src.value() if src.value is not None else None
                return v if v is not None else self.run(src.handle, flops_key)
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

        try:
            value = recipe.run(value_of)
        finally:
            for src in borrowed:
                if src.state != "consumed":
                    s.pager.release(src.handle)
        if flops_key is not None:
            with s._lock:
                s._count(flops_key, recipe.flops)
                if flops_key == "recompute_flops":
                    s._count("bytes_recomputed", value.numel() * value.element_size())
        return value

