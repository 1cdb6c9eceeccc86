"""Recompute of saved activations: what made each tensor, and running it again bit-exact.

Owns: the dispatch mode (:class:`Recorder`) that notes, inside a ``paged_activations``
context, the aten operation behind every tensor (function, arguments by identity, RNG state of
random operations, and in the recorded iteration its FLOPs and bytes touched); the recipe
(:class:`Recipe`) compiled for a saved tensor from that record, whose leaves are tensors that
stay available (another saved tensor the pager holds, or a parameter); running a recipe; and
the bitwise comparison that decides whether a recipe may be planned.

A tensor's record is a :class:`Node` set as the attribute ``_vta_node`` of the tensor (torch
keeps one Python object per tensor, so the attribute lives as long as the tensor); a node holds
the nodes of its arguments, never their tensors (a weak reference for tensors made outside the
context), so recording keeps no activation alive. A node is valid while the tensor's
``_version`` is the one it recorded: an in-place change of the tensor, or of the base of a view,
makes it stale, and a stale tensor is never recomputed.

What is never recomputed: operations with a mutable schema (in-place, ``out=``, batch norm's
running statistics) unless they write a fresh value of the recipe's own (dropout's mask:
``empty_like`` then ``bernoulli_``); operations tagged ``nondeterministic_bitwise``;
``empty*`` values not overwritten; anything whose inputs are not available; anything the
recorded iteration did not verify bit-exact (the planner's ``recomputable`` flag).
Invariants: a recipe runs under no_grad with autocast off (the dispatch level already sees
cast arguments) and restores the RNG state it changed; its result has the saved tensor's
shape, strides, dtype and device, and shares no memory with its sources; a parameter that
changed since it was read raises :class:`SourceChangedError`, never a wrong value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map_only

from ..activation_plan import MAX_CHAIN
from ..errors import SourceChangedError

__all__ = ["Recorder", "Recipe", "Node", "bitwise_equal", "SourceChangedError"]

ATTR_NODE = "_vta_node"
_OVERWRITE = {"bernoulli_", "uniform_", "normal_", "fill_", "zero_", "random_", "exponential_", "copy_"}
MAX_STEPS = 4 * MAX_CHAIN  # operations one recipe may run


class Node:
    """What made one tensor (see the module docstring)."""

    __slots__ = ("func", "args", "kwargs", "out", "version", "rng", "inplace", "view", "ext", "saved",
                 "flops", "touched", "__weakref__")

    def __init__(self, func: Any, args: Any, kwargs: Any, out: int | None, version: int, *, rng: Any = None,
                 inplace: bool = False, view: bool = False, ext: Any = None) -> None:
        self.func, self.args, self.kwargs, self.out, self.version = func, args, kwargs, out, version
        self.rng, self.inplace, self.view, self.ext = rng, inplace, view, ext
        self.saved: Any = None  # weakref to the pager's record of this value, once saved
        self.flops = self.touched = 0


def node_of(t: torch.Tensor) -> Node | None:
    n = getattr(t, ATTR_NODE, None)
    return n if n is not None and n.version == t._version else None


def _external(t: torch.Tensor) -> Node:
    """A tensor made outside the recorder's sight (an input, a parameter, a buffer)."""
    n = node_of(t)
    if n is None:
        n = Node(None, (), {}, None, t._version, ext=weakref.ref(t))
        setattr(t, ATTR_NODE, n)
    return n


def _rng_state(device: torch.device) -> Any:
    if device.type == "cuda":
        return ("cuda", device.index, torch.cuda.get_rng_state(device))
    return ("cpu", None, torch.get_rng_state())


@contextlib.contextmanager
def _rng_as(state: Any):
    kind, index, value = state
    if kind == "cuda":
        before = torch.cuda.get_rng_state(index)
        torch.cuda.set_rng_state(value, index)
        try:
            yield
        finally:
            torch.cuda.set_rng_state(before, index)
    else:
        before = torch.get_rng_state()
        torch.set_rng_state(value)
        try:
            yield
        finally:
            torch.set_rng_state(before)


def _cost(func: Any, args: Any, kwargs: Any, out: Any) -> tuple[int, int, bool]:
    """(FLOPs, bytes touched, whether torch has a FLOP formula for it) of one call: torch's
    formula where it has one (what ``FlopCounterMode`` counts), else one per element."""
    tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
    touched = sum(t.numel() * t.element_size() for t in tensors + outs)
    try:
        from torch.utils.flop_counter import flop_registry

        f = flop_registry.get(func._overloadpacket)
        if f is not None:
            return int(f(*args, **kwargs, out_val=out)), touched, True
    except Exception:  # noqa: BLE001 - a formula that does not fit this call: count per element
        pass
    return sum(o.numel() for o in outs), touched, False


class Recorder(TorchDispatchMode):
    """Notes the node of every tensor an operation returns or writes (``measure``: with its cost)."""

    def __init__(self) -> None:
        super().__init__()
        self.measure = False
        self.flops = 0  # measured: of every operation seen, one per element where torch has no formula
        # measured: of the operations torch has a FLOP formula for (matmuls, convolutions,
        # attention): the forward's FLOPs as FlopCounterMode counts them, what the cap is a share of
        self.formula_flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        schema = func._schema
        first = next((a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)), None)
        rng = None
        if torch.Tag.nondeterministic_seeded in func.tags and first is not None:
            rng = _rng_state(first.device)
        a_nodes, k_nodes = tree_map_only(torch.Tensor, lambda t: node_of(t) or _external(t), (args, kwargs))
        out = func(*args, **kwargs)
        flops = touched = 0
        if self.measure:
            flops, touched, formula = _cost(func, args, kwargs, out)
            self.flops += flops
            self.formula_flops += flops if formula else 0
        written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]
        if written:
            name = func._schema.name.split("::")[-1]
            for i in written:
                t = args[i] if i < len(args) else kwargs.get(schema.arguments[i].name)
                if not isinstance(t, torch.Tensor):
                    continue
                # The version counter is bumped above this dispatch level, after this returns.
                if i == 0 and name.endswith("_") and len(written) == 1:
                    n = Node(func, a_nodes, k_nodes, None, t._version + 1, rng=rng, inplace=True)
                    n.flops, n.touched = flops, touched
                else:  # out= and the like: what it now holds is opaque
                    n = Node(None, (), {}, None, t._version + 1, ext=weakref.ref(t))
                setattr(t, ATTR_NODE, n)
            return out
        if func is torch.ops.aten.empty_like.default and isinstance(out, torch.Tensor):
            # Only the input's layout matters (dropout's mask starts so): no data dependency.
            n = Node(torch.ops.aten.empty_strided.default, (tuple(out.shape), tuple(out.stride())),
                     {"dtype": out.dtype, "device": out.device}, None, out._version)
            setattr(out, ATTR_NODE, n)
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            ret = schema.returns[i] if i < len(schema.returns) else None
            view = ret is not None and ret.alias_info is not None
            n = Node(func, a_nodes, k_nodes, i if isinstance(out, (tuple, list)) else None, o._version, rng=rng, view=view)
            n.flops, n.touched = flops, touched
            setattr(o, ATTR_NODE, n)
        return out


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


@dataclasses.dataclass
class Recipe:
    """A saved tensor's value as a short program over leaves that stay available."""

    prog: list            # ("saved", record) | ("param", weakref, version) | ("op", func, args, kwargs, out, rng):
    #                       op arguments name earlier entries as _Slot(i)
    meta: tuple           # (shape, stride, dtype, device)
    signature: tuple      # operations and leaves, to check a later iteration repeats the verified recipe
    flops: int
    touched: int
    ops: int

    @property
    def op(self) -> str:
        return self.prog[-1][1].__name__

    def sources(self) -> list:
        return [e[1] for e in self.prog if e[0] == "saved"]

    def run(self, value_of: Callable[[Any], torch.Tensor]) -> torch.Tensor:
        """The value again. ``value_of(record)`` gives a saved leaf's value, readable during the call."""
        vals: list[Any] = []
        leaf_storage = set()
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
                    _, func, args, kwargs, out, rng = e
                    a, k = tree_map_only(_Slot, lambda s: vals[s.i], (args, kwargs))
                    with (_rng_as(rng) if rng is not None else contextlib.nullcontext()):
                        r = func(*a, **k)
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


def _name(func: Any) -> str:
    return func._schema.name.split("::")[-1]


def compile_recipe(t: torch.Tensor, record_of: Callable[[Node], Any]) -> Recipe | None:
    """The recipe of ``t``'s value from available leaves, or None. ``record_of(node)`` gives the
    pager's record holding that node's value (or None)."""
    node = node_of(t)
    if node is None or node.func is None:
        return None
    prog: list = []
    sig: list = []
    memo: dict[int, tuple[int, bool]] = {}  # id(node) -> (slot, the value is the recipe's own)
    cost = [0, 0, 0]

    def leaf(n: Node) -> tuple[int, bool] | None:
        rec = record_of(n)
        if rec is not None:
            prog.append(("saved", rec))
            sig.append(("saved", rec.index))
            return len(prog) - 1, False
        if n.func is None:
            p = n.ext()
            base = None if p is None else (p._base if p._base is not None else p)
            if base is not None and base.is_leaf and base.requires_grad:
                prog.append(("param", n.ext, n.version))
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
        if n.func is None or depth > MAX_CHAIN or cost[2] >= MAX_STEPS:
            return None
        tags = n.func.tags
        if torch.Tag.nondeterministic_bitwise in tags or (n.func._schema.is_mutable and not n.inplace):
            return None
        if torch.Tag.nondeterministic_seeded in tags and n.rng is None:
            return None
        got_args: list = []

        def arg(x: Node) -> Any:
            got = visit(x, depth + 1, False)
            got_args.append(got)
            return None if got is None else _Slot(got[0])

        a, k = tree_map_only(Node, arg, (n.args, n.kwargs))
        if any(g is None for g in got_args):
            return None
        if n.inplace:
            # Writes in place: only into a value of the recipe's own, and an uninitialised one
            # only by an operation that overwrites all of it.
            if not (got_args and got_args[0][1]):
                return None
        prog.append(("op", n.func, a, k, n.out, n.rng))
        sig.append((_name(n.func), n.out))
        cost[0] += n.flops
        cost[1] += n.touched
        cost[2] += 1
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
    names = [_name(e[1]) for e in prog if e[0] == "op"]
    # An uninitialised value is used only as the target of an in-place overwrite.
    for i, e in enumerate(prog):
        if e[0] == "op" and _name(e[1]).startswith(("empty", "new_empty")):
            readers = [r for r in prog[i + 1:] if r[0] == "op" and any(isinstance(x, _Slot) and x.i == i
                                                                       for x in tree_flatten((r[2], r[3]))[0])]
            if not readers or any(_name(r[1]) not in _OVERWRITE for r in readers):
                return None
    if not names:
        return None
    # An in-place step's target is read by nothing else (its old value is gone once it ran).
    for e in prog:
        if e[0] == "op" and e[1]._schema.is_mutable:
            target = e[2][0]
            others = [r for r in prog if r is not e and r[0] == "op"
                      and any(isinstance(x, _Slot) and x.i == target.i for x in tree_flatten((r[2], r[3]))[0])]
            if others:
                return None
    return Recipe(prog, (tuple(t.shape), tuple(t.stride()), t.dtype, t.device), tuple(sig), cost[0], cost[1], cost[2])


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
