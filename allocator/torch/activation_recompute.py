"""Recompute of saved activations: a saved tensor's recipe, and running it again bit-exact.

Owns: the recipe (:class:`Recipe`) compiled for a saved tensor from the recorder's nodes
(``activation_recorder``), whose leaves are tensors that stay available (another saved tensor
the pager holds, or a parameter); the recipe's template (:class:`RecipeTemplate`: the same
program with its leaves named by pack index and parameter, its operations by position, and
what the trace check must see at each position: where every tensor argument came from), which
later iterations, run without the recorder, bind to their own saved tensors; running a recipe;
the bitwise comparison that decides, in the recorded iteration, whether a recipe may be used;
why a tensor has no recipe.

What is recomputed: any chain of operations from saved tensors and parameters, multi-output
operations included (``native_layer_norm``'s output from its saved input, weight and bias;
the outputs of the attention kernels; batch norm's in training mode, by the recorder's stand-in
that writes no running statistics), matmuls (``addmm``, ``mm``, ``bmm``) over views,
transposes and reshapes, views of views. Views cost nothing and do not count toward the depth.

What is never recomputed: operations with a mutable schema (in-place, ``out=``) unless they
write a fresh value of the recipe's own (dropout's mask: ``empty_like`` then ``bernoulli_``);
a call that writes batch norm's running statistics, whatever its schema says (refused at
compile time and again when it runs); operations tagged ``nondeterministic_bitwise``;
``empty*`` values not overwritten; anything reading a tensor the pager does not hold that is
neither a parameter nor recomputable within the bounds (a model input, a buffer); random
operations whose RNG state was not captured; anything not verified bit-exact in the recorded
iteration, and in a later one anything the trace check did not see run the same way
(docs/activation-plan.md).
Invariants: a recipe runs under no_grad with autocast off (the dispatch level already sees
cast arguments) and restores the RNG state it changed; its result has the saved tensor's
shape, strides, dtype and device, and shares no memory with its sources; it never writes in
place into a value it does not own (checked again at run time); a parameter that changed
since it was read raises :class:`SourceChangedError`, never a wrong value.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map_only

from ..errors import SourceChangedError
from .activation_recorder import Node, Recorder, node_of, rng_as, writes_running_stats

__all__ = ["Recorder", "Recipe", "RecipeTemplate", "Node", "compile_recipe", "bitwise_equal", "SourceChangedError"]

_OVERWRITE = {"bernoulli_", "uniform_", "normal_", "fill_", "zero_", "random_", "exponential_", "copy_"}
MAX_STEPS = 16             # operations that compute (views aside) one recipe may run
MAX_DEPTH = 8              # operations that compute (views aside), nested, from the tensor to a leaf
MAX_ENTRIES = 96           # program entries in all, views and leaves included


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def _name(func: Any) -> str:
    return func._schema.name.split("::")[-1]


def _is_param(t: Any) -> bool:
    base = t._base if t._base is not None else t
    return bool(base.is_leaf and base.requires_grad)


@dataclasses.dataclass
class Recipe:
    """A saved tensor's value as a short program over leaves that stay available."""

    prog: list            # ("saved", record, node) | ("param", weakref, version, node) |
    #                       ("op", func, args, kwargs, out, rng, position, node): op arguments name earlier entries as _Slot(i)
    meta: tuple           # (shape, stride, dtype, device)
    signature: tuple      # operations and leaves
    flops: int
    touched: int
    ops: int              # operations it runs, views included (each costs the host one launch)
    flops_at: dict = dataclasses.field(default_factory=dict)  # position -> FLOPs of its operation

    @property
    def op(self) -> str:
        return _name(self.prog[-1][1])

    def sources(self) -> list:
        return [e[1] for e in self.prog if e[0] == "saved"]

    def shares(self) -> bool:
        """Whether its results may be shared with other recipes of a segment (it writes nothing in place)."""
        return not any(e[0] == "op" and e[1]._schema.is_mutable for e in self.prog)

    def template(self, calls: list) -> "RecipeTemplate":
        """The program with its leaves named so a later iteration can bind its own, and, for each
        position it runs, where the call's tensor arguments come from (``calls``: the recorder's,
        per position): ("saved", pack index) | ("val", position, output) | ("param", weakref) |
        ("ext", weakref) | ("any",) (an ``empty_like``'s input: only the output's layout counts)."""
        prog: list = []
        leaves = {id(e[2]): e[1].index for e in self.prog if e[0] == "saved"}
        trace: dict[int, tuple] = {}
        for e in self.prog:
            if e[0] == "saved":
                prog.append(("saved", e[1].index))
            elif e[0] == "param":
                prog.append(("param", e[1]))
            else:
                _, func, args, kwargs, out, rng, pos, _node = e
                prog.append(("op", func, args, kwargs, out, None if rng is None else (rng[0], rng[1]), pos))
                trace[pos] = _sources_of(calls[pos], leaves)
        top = self.prog[-1]
        return RecipeTemplate(tuple(prog), self.meta, self.signature, self.flops, self.touched, self.ops,
                              tuple(sorted(trace.items())), (top[6], top[4]), dict(self.flops_at))

    def run(self, value_of: Callable[[Any], torch.Tensor], memo: dict | None = None) -> torch.Tensor:
        """The value again. ``value_of(record)`` gives a saved leaf's value, readable during the
        call. ``memo``: results by position of the other recipes run in the same segment (a
        multi-output operation two of them end in runs once); a recipe that writes in place
        neither reads nor fills it."""
        vals: list[Any] = []
        leaf_storage = set()
        if not self.shares():
            memo = None
        with _disable_current_modes(), torch.no_grad(), _no_autocast():
            for e in self.prog:
                if e[0] == "saved":
                    v = value_of(e[1])
                elif e[0] == "param":
                    v = e[1]()
                    if v is None or v._version != e[2]:
                        raise SourceChangedError(
                            "a parameter this saved activation is recomputed from changed in place (or was freed) "
                            "between forward and backward; autograd would refuse it too")
                else:
                    _, func, args, kwargs, out, rng = e[:6]
                    a, k = tree_map_only(_Slot, lambda s: vals[s.i], (args, kwargs))
                    if func._schema.is_mutable and a and isinstance(a[0], torch.Tensor) and a[0].numel() \
                            and a[0].untyped_storage().data_ptr() in leaf_storage:
                        raise SourceChangedError("a recipe would write in place into a value it does not own")
                    if writes_running_stats(func, a, k):
                        raise SourceChangedError("a recipe would write batch norm's running statistics")
                    r = memo.get(e[6]) if memo is not None else None
                    if r is None:
                        with (rng_as(rng) if rng is not None else contextlib.nullcontext()):
                            r = func(*a, **k)
                        if memo is not None:
                            memo[e[6]] = r
                    vals.append(r[out] if out is not None else r)
                    continue
                if v.numel():
                    leaf_storage.add(v.untyped_storage().data_ptr())
                vals.append(v)
            res = vals[-1]
            shape, stride, dtype, device = self.meta
            if res.numel() and (res.untyped_storage().data_ptr() in leaf_storage or tuple(res.stride()) != stride):
                res = _copy_strided(res, shape, stride)
        return res


def _sources_of(call: tuple, leaves: dict[int, int]) -> tuple:
    """Where each tensor argument of a recorded call comes from, for the trace check."""
    func, flat = call
    refs: list[tuple] = []
    for x in flat:
        if not isinstance(x, Node):
            continue
        if func is torch.ops.aten.empty_like.default:
            refs.append(("any",))
        elif id(x) in leaves:
            refs.append(("saved", leaves[id(x)]))
        elif x.func is not None:
            refs.append(("val", x.pos, x.out))
        else:
            t = x.ext() if x.ext is not None else None
            refs.append(("param" if t is not None and _is_param(t) else "ext", x.ext))
    return tuple(refs)


@dataclasses.dataclass(frozen=True)
class RecipeTemplate:
    """A verified recipe with its leaves named, not held: ("saved", pack index) | ("param",
    weakref) | ("op", func, args, kwargs, out, generator (kind, index) or None, position); and
    what the trace check must see: per position it runs, the sources of the call's tensor
    arguments (:meth:`Recipe.template`), and the position and output that made the tensor."""

    prog: tuple
    meta: tuple
    signature: tuple
    flops: int
    touched: int
    ops: int
    trace: tuple = ()                 # ((position, sources of its tensor arguments), ...)
    top: tuple = (-1, None)           # (position, output) of the saved tensor
    flops_at: dict = dataclasses.field(default_factory=dict)  # position -> FLOPs of its operation

    def positions(self) -> set[int]:
        """Positions the trace check must observe: the recipe's own, and those a source names."""
        got = {p for p, _ in self.trace}
        got.update(r[1] for _, refs in self.trace for r in refs if r[0] == "val")
        return got

    def span(self) -> tuple[int, int]:
        """The first and last positions the trace check must watch (its windows hold them)."""
        got = self.positions() | {self.top[0]}
        return min(got), max(got)

    def random(self) -> dict[int, tuple]:
        """Position -> generator of the random operations it replays."""
        return {e[6]: e[5] for e in self.prog if e[0] == "op" and e[5] is not None}

    def bind(self, record_at: Callable[[int], Any], rng_at: Callable[[int], Any]) -> tuple[Recipe | None, str]:
        """This iteration's recipe: its records at the pack indices, the parameters' versions now,
        the RNG states the trace check noted at its random operations' positions. (None, why) if
        one is missing. The trace check must still prove it (activation_check)."""
        prog: list = []
        for e in self.prog:
            if e[0] == "saved":
                rec = record_at(e[1])
                if rec is None:
                    return None, f"saved tensor #{e[1]} it reads is not held this iteration"
                prog.append(("saved", rec, None))
            elif e[0] == "param":
                p = e[1]()
                if p is None:
                    return None, "a parameter it reads was freed"
                prog.append(("param", e[1], p._version, None))
            else:
                _, func, args, kwargs, out, gen, pos = e
                rng = None
                if gen is not None:
                    rng = rng_at(pos)
                    if rng is None:
                        return None, "no RNG state noted at its position"
                prog.append(("op", func, args, kwargs, out, rng, pos, None))
        return Recipe(prog, self.meta, self.signature, self.flops, self.touched, self.ops, self.flops_at), ""


def _no_autocast() -> Any:
    stack = contextlib.ExitStack()
    for dev in ("cpu", "cuda"):
        with contextlib.suppress(Exception):
            stack.enter_context(torch.autocast(dev, enabled=False))
    return stack


def _copy_strided(src: torch.Tensor, shape: tuple, stride: tuple) -> torch.Tensor:
    """A copy of ``src`` in memory of its own laid out with ``stride`` (an expanded one: its storage span)."""
    span = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if src.numel() else 0
    if span == src.numel():
        out = torch.empty_strided(shape, stride, dtype=src.dtype, device=src.device)
        out.copy_(src)
        return out
    if tuple(src.stride()) == tuple(stride):  # overlapping (expanded): copy the storage span under it
        flat = src.as_strided((span,), (1,), src.storage_offset()).clone()
        return flat.as_strided(shape, stride, 0)
    raise SourceChangedError("a recomputed value cannot take the saved tensor's strides")  # verify refuses it


def compile_recipe(t: torch.Tensor, record_of: Callable[[Node], Any], why: list[str] | None = None) -> Recipe | None:
    """The recipe of ``t``'s value from available leaves, or None (the first reason found is
    appended to ``why``). ``record_of(node)`` gives the pager's record holding that node's value
    (or None)."""
    reasons: list[str] = []

    def fail(reason: str) -> Any:  # -> None, so that `return fail(...)` gives up with a reason
        if not reasons:
            reasons.append(reason)
        return None

    try:
        recipe = _compile(t, record_of, fail)
    finally:
        if why is not None and reasons:
            why.append(reasons[0])
    return recipe


def _compile(t: torch.Tensor, record_of: Callable[[Node], Any], fail: Callable[[str], Any]) -> Recipe | None:
    node = node_of(t)
    if node is None:
        return fail("not made under the recorder (or changed in place since)")
    if node.func is None:
        return fail("made outside the recorded forward (an input or a buffer)" if node.ext is not None
                    else "written by an out= operation")
    prog: list = []
    sig: list = []
    memo: dict[int, tuple[int, bool]] = {}  # id(node) -> (slot, the value is the recipe's own)
    cost = [0, 0, 0]
    flops_at: dict[int, int] = {}

    def leaf(n: Node) -> tuple[int, bool] | None:
        rec = record_of(n)
        if rec is not None:
            prog.append(("saved", rec, n))
            sig.append(("saved", rec.index))
            return len(prog) - 1, False
        if n.func is None:
            p = n.ext() if n.ext is not None else None
            if p is not None and _is_param(p):
                prog.append(("param", n.ext, n.version, n))
                sig.append(("param", tuple(p.shape)))
                return len(prog) - 1, False
        return None

    def visit(n: Node, depth: int, top: bool) -> tuple[int, bool] | None:
        if id(n) in memo:
            return memo[id(n)]
        got = None if top else leaf(n)
        if got is None:
            got = step(n, depth)
        if got is not None:
            memo[id(n)] = got
        return got

    def step(n: Node, depth: int) -> tuple[int, bool] | None:
        if n.func is None:
            return fail("reads a tensor made outside the recorded forward that is neither saved nor a "
                        "parameter (a model input, a buffer)" if n.ext is not None
                        else "reads a tensor an out= operation wrote")
        if len(prog) >= MAX_ENTRIES:
            return fail(f"more than {MAX_ENTRIES} entries")
        if not n.view:
            if depth >= MAX_DEPTH:
                return fail(f"reaches a leaf only through more than {MAX_DEPTH} nested operations")
            if cost[2] >= MAX_STEPS:
                return fail(f"more than {MAX_STEPS} operations")
        tags = n.func.tags
        if torch.Tag.nondeterministic_bitwise in tags:
            return fail(f"{_name(n.func)} is not bitwise deterministic")
        if (n.func._schema.is_mutable and not n.inplace) or writes_running_stats(n.func, n.args, n.kwargs):
            return fail(f"{_name(n.func)} mutates its arguments")
        if torch.Tag.nondeterministic_seeded in tags and n.rng is None:
            return fail(f"random {_name(n.func)} with no RNG state")
        got_args: list = []
        below = depth if n.view else depth + 1

        def arg(x: Node) -> Any:
            got = visit(x, below, False)
            got_args.append(got)
            return None if got is None else _Slot(got[0])

        a, k = tree_map_only(Node, arg, (n.args, n.kwargs))
        if any(g is None for g in got_args):
            return None  # the reason was given where it failed
        if n.inplace:
            # Writes in place: only into a value of the recipe's own, and an uninitialised one
            # only by an operation that overwrites all of it.
            if not (got_args and got_args[0][1]):
                return fail(f"{_name(n.func)} writes in place into a value the recipe does not own")
        prog.append(("op", n.func, a, k, n.out, n.rng, n.pos, n))
        sig.append((_name(n.func), n.out))
        cost[0] += n.flops
        flops_at[n.pos] = n.flops
        cost[1] += n.touched
        cost[2] += 0 if n.view else 1
        own = (got_args[0][1] if got_args else True) if n.view else True
        return len(prog) - 1, own

    try:
        top = visit(node, 0, True)
    finally:
        # The three closures name each other (a reference cycle that would hold the records in
        # prog until the cyclic collector ran): cut it.
        visit = step = leaf = None  # type: ignore[assignment]  # noqa: F841
    if top is None:
        return None
    ops = [e for e in prog if e[0] == "op"]
    # An uninitialised value is used only as the target of an in-place overwrite.
    for i, e in enumerate(prog):
        if e[0] == "op" and _name(e[1]).startswith(("empty", "new_empty")):
            readers = [r for r in prog[i + 1:] if r[0] == "op" and any(isinstance(x, _Slot) and x.i == i
                                                                       for x in tree_flatten((r[2], r[3]))[0])]
            if not readers or any(_name(r[1]) not in _OVERWRITE for r in readers):
                return fail("reads an uninitialised value")
    if not ops:
        return fail("no operation to run")
    # An in-place step's target is read by nothing else (its old value is gone once it ran).
    for e in ops:
        if e[1]._schema.is_mutable:
            target = e[2][0]
            others = [r for r in ops if r is not e
                      and any(isinstance(x, _Slot) and x.i == target.i for x in tree_flatten((r[2], r[3]))[0])]
            if others:
                return fail(f"{_name(e[1])}'s target is read by another operation of the recipe")
    # priced at one launch of host time per operation, views included (as the recorder's forward clock)
    return Recipe(prog, (tuple(t.shape), tuple(t.stride()), t.dtype, t.device), tuple(sig), cost[0], cost[1], len(ops),
                  flops_at)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, strides, dtype and the same bits (NaN payloads included)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.numel() == 0:
        return True
    if tuple(a.stride()) != tuple(b.stride()):
        return False
    ba = a.detach().contiguous().reshape(-1).view(torch.uint8)
    bb = b.detach().contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(ba, bb))
