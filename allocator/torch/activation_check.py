"""The trace check: a later iteration proves it ran the recorded operations on the same inputs.

Owns: what the check must see (:class:`TraceSpec`, made once from the recorded iteration's calls
and the plan's recipe templates) and the dispatch mode (:class:`TraceCheck`) that, in the
windows of every later iteration's forward where the plan's recipes run (``activation_windows``:
opened and closed at module boundaries; the whole forward where there are none), compares each
aten operation with the recorded one at the same position, notes what the positions the plan's
recipes replay read and made, and the RNG state before their random operations; then, at the
pack of a tensor the plan recomputes, proves its recipe (:meth:`TraceCheck.proves`) without
running it.

Why this is enough: in the recorded iteration each recipe was run and compared bit for bit with
its tensor. A later iteration reproduces that run if every operation of the recipe ran again
as the same function with the same constants, on the same tensors (the same objects at the same
versions: the saved tensors the recipe reads at the versions they were saved, the parameters
unchanged since, the recipe's own intermediate values), from the same RNG state: deterministic
kernels then give the same bits. Everything proven is about the calls themselves (their
function, constants and tensors, the tensor packed made by the last one); a position is only how
a call is matched with the recorded one. A window opens at the position the recorded iteration
noted at that module boundary; within it positions line up while it runs the recorded
functions, and from its first other function on nothing more in it is proven. What it costs:
one Python call per operation in its windows, and at the plan's positions the arguments read and
the outputs referenced (docs/activation-plan.md; ``CostModel.check_s``).
Identity without holding tensors: each tensor the check meets (read or made at a position it
observes, or packed where a recipe reads it) carries a token of this iteration (an attribute,
set the first time it is met); a tensor that dies between two sightings cannot be taken for
another, as its token goes with it.
Invariants: the mode never changes what an operation returns; it holds no tensor (tokens and
versions, and weak references to parameters and buffers only); a recipe is proven only if
every position it names was observed, lined up, in this iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from .activation_recorder import Node, flatten, produced, rng_state

__all__ = ["TraceSpec", "TraceCheck"]

ATTR_TOKEN = "_vta_check"


@dataclasses.dataclass(frozen=True)
class _Position:
    consts: tuple          # (flat index, value) of every argument that is not a tensor (structure included)
    tensors: tuple         # flat indices of the tensor arguments
    n: int                 # flattened arguments (activation_recorder.flatten)
    generator: Any         # (kind, index) of a random operation a recipe replays, else None
    layout: tuple | None   # an empty_like's output (shape, stride, dtype): its input is not compared


@dataclasses.dataclass(frozen=True)
class TraceSpec:
    """The recorded functions by position, and what to note at the positions the plan needs."""

    funcs: tuple
    positions: dict

    @classmethod
    def of(cls, calls: list, templates: Any) -> "TraceSpec":
        need: dict[int, Any] = {}
        for t in templates:
            gens = t.random()
            for p in t.positions():
                if p >= 0 and (p not in need or gens.get(p) is not None):
                    need[p] = gens.get(p, need.get(p))
        positions = {}
        for p, gen in need.items():
            func, flat = calls[p]
            layout = None
            if func is torch.ops.aten.empty_like.default:
                layout = next((_layout_of(e) for t in templates for e in t.prog if e[0] == "op" and e[6] == p), None)
            positions[p] = _Position(tuple((k, x) for k, x in enumerate(flat) if not isinstance(x, Node)),
                                     tuple(k for k, x in enumerate(flat) if isinstance(x, Node)), len(flat), gen,
                                     layout)
        return cls(tuple(c[0] for c in calls), positions)


def _layout_of(entry: tuple) -> tuple:
    args, kwargs = entry[2], entry[3]
    return (tuple(args[0]), tuple(args[1]), kwargs.get("dtype"))


class TraceCheck(TorchDispatchMode):
    """One later iteration's check (module docstring). ``packed(index, tensor)`` is told each
    pack; :meth:`proves` answers for one recipe template at the pack of its tensor."""

    def __init__(self, spec: TraceSpec) -> None:
        super().__init__()
        self.spec = spec
        self.pos = 0
        self.lined_up = True             # every operation of the open window so far was the recorded one
        self.mismatch = False            # some window ran another function than recorded at a position
        self.active = False              # a window is open (the mode is pushed)
        self.checked = 0                 # operations seen in windows
        self.seen: dict[int, tuple] = {}  # position -> (as recorded?, [(token, version, id)], {out: (token, version)})
        self.rng: dict[int, Any] = {}
        self._packed: dict[int, tuple] = {}  # pack index -> (token, version)
        self.observed = 0
        self._stamp = object()           # this iteration's: tokens of earlier ones are not this one's
        self._n = 0

    def _token(self, t: Any) -> int:
        tok = getattr(t, ATTR_TOKEN, None)
        if tok is None or tok[0] is not self._stamp:
            self._n += 1
            tok = (self._stamp, self._n)
            try:
                setattr(t, ATTR_TOKEN, tok)
            except (AttributeError, RuntimeError):
                pass  # a tensor that takes no attribute matches nothing: its recipes are not proven
        return tok[1]

    def open(self, pos: int) -> None:
        """A window opens: the next operation is the one recorded at ``pos``."""
        if self.active:
            return
        self.pos, self.lined_up, self.active = pos, True, True
        self.__enter__()

    def close(self) -> None:
        """The window closes (only if this mode is the innermost: else it stays open, which costs
        more and proves as much)."""
        from .activation_windows import innermost_is

        if self.active and innermost_is(self):
            self.__exit__(None, None, None)
            self.active = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        p = self.pos
        self.pos = p + 1
        self.checked += 1
        funcs = self.spec.funcs
        if self.lined_up and p < len(funcs) and funcs[p] is func:
            want = self.spec.positions.get(p)
            if want is not None:
                return self._observe(p, want, func, args, kwargs)
        elif self.lined_up:
            self.lined_up, self.mismatch = False, True
        return func(*args, **kwargs)

    def _observe(self, p: int, want: _Position, func: Any, args: Any, kwargs: Any) -> Any:
        flat = flatten(args, kwargs)
        same = len(flat) == want.n and all(type(flat[k]) is type(v) and _equal(flat[k], v) for k, v in want.consts)
        got: list[tuple[Any, int]] = []
        for k in want.tensors:
            t = flat[k]
            if not isinstance(t, torch.Tensor):
                same = False
                break
            got.append((t, t._version))  # tokens after the call: an in-place one writes after it read
        if want.generator is not None:
            self.rng[p] = rng_state(want.generator)
        out = func(*args, **kwargs)
        reads = [(self._token(t), v, id(t)) for t, v in got]
        made = {key: (self._token(t), v) for key, t, v in produced(func, args, out)}
        if want.layout is not None and isinstance(out, torch.Tensor):
            same = same and (tuple(out.shape), tuple(out.stride()), out.dtype) == want.layout
        self.seen[p] = (same, reads, made)
        self.observed += 1
        return out

    def packed(self, index: int, tensor: Any) -> None:
        self._packed[index] = (self._token(tensor), tensor._version)

    def rng_at(self, pos: int) -> Any:
        return self.rng.get(pos)

    def proves(self, template: Any, tensor: Any) -> str:
        """'' if this iteration ran ``template``'s recipe as recorded, on the same inputs, and
        ``tensor`` is what it made; else why not."""
        for p, refs in template.trace:
            got = self.seen.get(p)
            if got is None:
                return f"another operation ran at or before position {p}"
            if not got[0]:
                return f"position {p} ran with other arguments"
            for (tok, version, ident), src in zip(got[1], refs):
                why = self._same(tok, version, ident, src)
                if why:
                    return f"position {p}: {why}"
        pos, out = template.top
        made = self.seen.get(pos, (None, None, {}))[2].get(out)
        if made is None or made[0] != self._token(tensor) or made[1] != tensor._version:
            return "the saved tensor is not what the recipe's last operation made"
        return ""

    def _same(self, tok: int, version: int, ident: int, src: tuple) -> str:
        kind = src[0]
        if kind == "any":
            return ""
        if kind == "saved":
            want = self._packed.get(src[1])
        elif kind == "val":
            got = self.seen.get(src[1])
            want = got[2].get(src[2]) if got is not None else None
        else:  # a parameter or a buffer (alive throughout): the same object, unchanged since it was read
            expect = src[1]() if src[1] is not None else None
            same = expect is not None and id(expect) == ident and expect._version == version
            return "" if same else f"another {kind} was read (or it changed)"
        if want is None or want[0] != tok or want[1] != version:
            return f"an argument is not the recorded {kind} {src[1]}"
        return ""


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are not the same
        return False
