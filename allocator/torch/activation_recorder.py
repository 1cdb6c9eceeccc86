"""The recorder of the activation plan: what made each tensor of the recorded iteration.

Owns: the dispatch mode (:class:`Recorder`) that runs only in the recorded iteration of a
``paged_activations`` context and notes the aten operation behind every tensor (function,
arguments by identity, the RNG state of random operations, its FLOPs and bytes touched, its
position); the record (:class:`Node`) set on each tensor; the cost of one operation; what a
call made (:func:`produced`, shared with the trace check).

A tensor's record is a :class:`Node` set as the attribute ``_vta_node`` of the tensor (torch
keeps one Python object per tensor, so the attribute lives as long as the tensor); a node holds
the nodes of its arguments, never their tensors (a weak reference for tensors made outside the
context), so recording keeps no activation alive. A node is valid while the tensor's
``_version`` is the one it recorded (an in-place change of the tensor, or of the base of a view,
makes it stale, and a stale tensor is never recomputed) and, if an operation made it, only in
the recording that saw the operation (a tensor a forward cached from an earlier recorded
iteration is, to a later recording, made outside it). A node does not travel with its tensor:
pickled (``torch.save`` of a whole model) or deep-copied, it becomes None.

Positions: every aten operation the forward runs has a position (its index in the order the
mode saw them); :attr:`Recorder.calls` holds, per position, the function, the flattened
arguments (the node of each tensor, every other value as it was) and their structure: what a
later iteration's trace check (``activation_check``) compares its own operations with. The
RNG state of a random operation is noted before it runs (a later iteration's check notes it
again at the same position).

Costs: FLOPs by torch's ``flop_counter`` formulas (what ``FlopCounterMode`` counts: matmuls,
convolutions, CUDA attention), by this module's formulas for the matmul-family kernels torch
has none for (CPU flash attention, ``_addmm_activation``), else one per output element; views
(outputs that alias an input) cost nothing. ``formula_flops`` is the forward's FLOPs as
``FlopCounterMode`` counts them (the base of the recompute cap). With a cost model, the
recorder also keeps the forward's modelled clock (per operation max(device time, one launch)):
a pack's time into the forward, what the plan prices overlap against.
Invariants: the mode never changes what an operation returns; outputs that share storage with
an input are marked views whatever their schema says (``_unsafe_view`` aliases without saying
so), so a recipe never writes in place into a value it does not own; no node runs an operation
that writes batch norm's running statistics (:func:`writes_running_stats`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

__all__ = ["Recorder", "Node", "node_of", "external_node", "rng_key", "rng_state", "rng_as",
           "batch_norm_stand_in", "writes_running_stats", "produced", "flatten", "aliases", "op_cost"]

ATTR_NODE = "_vta_node"
_RECORDING: list[Any] = [None]  # the recording under way (nodes an operation made belong to one)


class Node:
    """What made one tensor (see the module docstring)."""

    __slots__ = ("func", "args", "kwargs", "out", "version", "rng", "inplace", "view", "ext", "saved",
                 "index", "pos", "flops", "touched", "recording", "__weakref__")

    def __init__(self, func: Any, args: Any, kwargs: Any, out: int | None, version: int, *, rng: Any = None,
                 inplace: bool = False, view: bool = False, ext: Any = None, pos: int = -1) -> None:
        self.func, self.args, self.kwargs, self.out, self.version = func, args, kwargs, out, version
        self.rng, self.inplace, self.view, self.ext, self.pos = rng, inplace, view, ext, pos
        self.saved: Any = None  # weakref to the pager's record of this value, once saved
        self.index: int | None = None  # the pack index it was first saved at
        self.flops = self.touched = 0
        self.recording = _RECORDING[0]

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        # A record of this process's recorded iteration, not part of the tensor: a tensor that is
        # saved (torch.save of a whole model) or deep-copied carries no node, so the copy is a
        # tensor made outside any recording (an aten op, a weak reference cannot be pickled).
        return _no_node, ()


def _no_node() -> None:
    return None


def node_of(t: torch.Tensor) -> Node | None:
    n = getattr(t, ATTR_NODE, None)
    if n is None or n.version != t._version or (n.func is not None and n.recording is not _RECORDING[0]):
        return None
    return n


def external_node(t: torch.Tensor) -> Node:
    """A tensor made outside the recorder's sight (an input, a parameter, a buffer)."""
    n = node_of(t)
    if n is None:
        n = Node(None, (), {}, None, t._version, ext=weakref.ref(t))
        setattr(t, ATTR_NODE, n)
    return n


def rng_key(device: torch.device) -> tuple[str, int]:
    """The generator a random operation on ``device`` draws from."""
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return ("cpu", -1)


def rng_state(key: tuple[str, int]) -> Any:
    kind, index = key
    if kind == "cuda":
        return ("cuda", index, torch.cuda.get_rng_state(index))
    return ("cpu", -1, torch.get_rng_state())


@contextlib.contextmanager
def rng_as(state: Any):
    """Run with the generator at ``state``; the state it had before is restored after."""
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


def _device_of(args: Any, kwargs: Any) -> torch.device:
    first = next((a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)), None)
    if first is not None:
        return first.device
    dev = kwargs.get("device")
    return torch.device(dev) if dev is not None else torch.device("cpu")


def _sdpa_cpu_flops(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(tuple(q.shape), tuple(k.shape), tuple(v.shape)))


def _addmm_act_flops(bias: Any, a: Any, b: Any, *args: Any, **kwargs: Any) -> int:
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


# Matmul-family kernels torch's flop counter has no formula for (it counts them as 0): their
# recompute is counted at what they cost, so a recipe that runs one is not planned as cheap.
_OWN_FORMULAS = {
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu_flops,
    "_addmm_activation": _addmm_act_flops,
}


def op_cost(func: Any, args: Any, kwargs: Any, out: Any, view: bool = False) -> tuple[int, int, bool]:
    """(FLOPs, bytes touched, whether ``FlopCounterMode`` counts it) of one call (module docstring)."""
    if view:
        return 0, 0, False
    tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
    touched = sum(t.numel() * t.element_size() for t in tensors + outs)
    try:
        from torch.utils.flop_counter import flop_registry

        f = flop_registry.get(func._overloadpacket)
        if f is not None:
            return int(f(*args, **kwargs, out_val=out)), touched, True
        own = _OWN_FORMULAS.get(func._overloadpacket.__name__)
        if own is not None:
            return own(*args, **kwargs), touched, False
    except Exception:  # noqa: BLE001 - a formula that does not fit this call: count per element
        pass
    return sum(o.numel() for o in outs), touched, False


# Batch norm operations that write running_mean and running_var in training mode; the value is
# whether their schema says so (the version counter is bumped above the dispatch level only then).
_BATCH_NORM_WRITES = {"native_batch_norm": False, "cudnn_batch_norm": False, "miopen_batch_norm": False,
                      "_native_batch_norm_legit": True, "_batch_norm_with_update": True}


def _bound(func: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    """The call's arguments by name (positional or keyword)."""
    names = [a.name for a in func._schema.arguments]
    return {**dict(zip(names, args)), **kwargs}


def writes_running_stats(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether this call is batch norm in training mode writing running statistics (its outputs
    have a stand-in, :func:`batch_norm_stand_in`; the call itself must never run again)."""
    name = func._schema.name.split("::")[-1]
    if name not in _BATCH_NORM_WRITES or func._overloadname == "no_stats":
        return False
    b = _bound(func, args, kwargs)
    training = True if name == "_batch_norm_with_update" else bool(b.get("training"))
    return training and (b.get("running_mean") is not None or b.get("running_var") is not None)


def batch_norm_stand_in(func: Any, args: Any, kwargs: Any) -> tuple[Any, tuple, dict] | None:
    """For batch norm in training mode with running statistics (``args``/``kwargs`` of any kind:
    tensors or their nodes), the call that computes its first three outputs from the batch alone
    and writes nothing (module docstring); None for any other call."""
    if not writes_running_stats(func, args, kwargs):
        return None
    b = _bound(func, args, kwargs)
    name = func._schema.name.split("::")[-1]
    if name in ("_native_batch_norm_legit", "_batch_norm_with_update"):
        return (torch.ops.aten._native_batch_norm_legit.no_stats,
                (b["input"], b["weight"], b["bias"], True, b["momentum"], b["eps"]), {})
    momentum, eps = (b["momentum"], b["eps"]) if name == "native_batch_norm" else \
        (b["exponential_average_factor"], b["epsilon"])
    return func, (b["input"], b["weight"], b["bias"], None, None, True, momentum, eps), {}


_SEQ = ("seq",)  # marks a list or tuple in a flattened call: (_SEQ, its length), then its items


def flatten(args: Any, kwargs: Any) -> list:
    """A call's arguments as one list: its structure (lists, tuples, keyword names) spelled out
    among the values, so that two calls flatten alike exactly when they have one structure.
    Faster than a pytree's flatten on the hot path of the trace check."""
    out: list = []

    def put(a: Any) -> None:
        if type(a) is list or type(a) is tuple:
            out.append((_SEQ, len(a)))
            for e in a:
                put(e)
        else:
            out.append(a)

    for a in args:
        put(a)
    for k, v in kwargs.items():
        out.append(k)
        put(v)
    return out


_SCHEMAS: dict[Any, tuple[bool, tuple[bool, ...]]] = {}


def _schema_of(func: Any) -> tuple[bool, tuple[bool, ...]]:
    """(whether it writes its first argument in place, which returns are views), per function."""
    got = _SCHEMAS.get(func)
    if got is None:
        w = written(func)
        got = (w == [0] and func._schema.name.endswith("_"),
               tuple(r.alias_info is not None for r in func._schema.returns))
        _SCHEMAS[func] = got
    return got


def _storages(ts: list) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in ts if isinstance(t, torch.Tensor) and t.numel()}


def alias_flags(func: Any, args: Any, kwargs: Any, out: Any) -> list[bool]:
    """Per output: whether it aliases an input (its schema says so, or it shares an input's
    storage: ``_unsafe_view`` aliases without saying so)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    rets = func._schema.returns
    in_storage = _storages(tree_flatten((args, kwargs))[0])
    return [isinstance(o, torch.Tensor) and ((i < len(rets) and rets[i].alias_info is not None)
                                            or bool(o.numel() and o.untyped_storage().data_ptr() in in_storage))
            for i, o in enumerate(outs)]


def aliases(func: Any, args: Any, kwargs: Any, out: Any) -> bool:
    """Whether every output of a call aliases an input (a view: it costs nothing)."""
    return all(alias_flags(func, args, kwargs, out))


def written(func: Any) -> list[int]:
    """The argument positions a call writes (its schema's write annotations)."""
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def produced(func: Any, args: Any, out: Any) -> list[tuple[int | None, Any, int]]:
    """What a call made, as (output index or None, tensor, its version once the call returned):
    the written argument of an in-place call (its version one up, bumped above this level), or
    each tensor output (batch norm's too, which also writes its running statistics) (a schema view shares its base's version counter, which it reads only
    once this level returned)."""
    inplace, views = _schema_of(func)
    if inplace:
        t = args[0] if args else None
        return [(None, t, t._version + 1)] if isinstance(t, torch.Tensor) else []
    multi = isinstance(out, (tuple, list))
    outs = out if multi else (out,)
    base = args[0] if args and isinstance(args[0], torch.Tensor) else None
    got = []
    for i, o in enumerate(outs):
        if isinstance(o, torch.Tensor):
            view = i < len(views) and views[i]
            got.append((i if multi else None, o, base._version if view and base is not None else o._version))
    return got


class Recorder(TorchDispatchMode):
    """Notes the node of every tensor an operation returns or writes, with its cost, and each
    operation's call by position."""

    def __init__(self, cost_model: Any = None) -> None:
        super().__init__()
        self.flops = 0  # of every operation seen, one per element where no formula applies
        # of the operations torch has a FLOP formula for (matmuls, convolutions, CUDA attention):
        # the forward's FLOPs as FlopCounterMode counts them, what a FLOPs cap is a share of
        self.formula_flops = 0
        self.calls: list[tuple[Any, tuple]] = []  # per position: (func, its arguments flattened)
        self.costs: list[tuple[int, int]] = []    # per position: (FLOPs, bytes touched)
        self.cost_model = cost_model
        self.clock_s = self.device_s = 0.0  # modelled forward so far (with a cost model)

    def __enter__(self) -> "Recorder":
        _RECORDING[0] = self
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        _RECORDING[0] = None

    def _cost(self, func: Any, args: Any, kwargs: Any, out: Any, view: bool = False) -> tuple[int, int]:
        flops, touched, formula = op_cost(func, args, kwargs, out, view)
        self.costs.append((flops, touched))
        self.flops += flops
        self.formula_flops += flops if formula else 0
        if self.cost_model is not None:
            dev = self.cost_model.device_s(flops, touched)
            self.device_s += dev
            self.clock_s += max(dev, self.cost_model.launch_s)
        return flops, touched

    def _batch_norm(self, func: Any, args: Any, kwargs: Any, out: Any, stand_in: tuple, pos: int) -> None:
        """Batch norm in training mode: its outputs made by the stand-in, its running statistics opaque."""
        flops, touched = self._cost(func, args, kwargs, out)
        sfunc, sargs, skwargs = stand_in
        for i, o in enumerate(out):
            if not isinstance(o, torch.Tensor):
                continue
            if i < 3:  # the output, the batch's mean and inverse standard deviation (variance: cuDNN's 3rd)
                n = Node(sfunc, sargs, skwargs, i, o._version, pos=pos)
                n.flops, n.touched = flops, touched
            else:  # cuDNN's reserve space: opaque
                n = Node(None, (), {}, None, o._version, ext=weakref.ref(o))
            setattr(o, ATTR_NODE, n)
        bumped = _BATCH_NORM_WRITES[func._schema.name.split("::")[-1]]
        b = _bound(func, args, kwargs)
        for key in ("running_mean", "running_var"):
            t = b.get(key)
            if isinstance(t, torch.Tensor):
                setattr(t, ATTR_NODE, Node(None, (), {}, None, t._version + int(bumped), ext=weakref.ref(t)))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        schema = func._schema
        pos = len(self.calls)
        rng = None
        if torch.Tag.nondeterministic_seeded in func.tags:
            rng = rng_state(rng_key(_device_of(args, kwargs)))
        a_nodes, k_nodes = tree_map_only(torch.Tensor, lambda t: node_of(t) or external_node(t), (args, kwargs))
        self.calls.append((func, tuple(flatten(a_nodes, k_nodes))))
        out = func(*args, **kwargs)
        stand_in = batch_norm_stand_in(func, a_nodes, k_nodes)
        if stand_in is not None:
            self._batch_norm(func, args, kwargs, out, stand_in, pos)
            return out
        w = written(func)
        if w:
            flops, touched = self._cost(func, args, kwargs, out)
            name = schema.name.split("::")[-1]
            for i in w:
                t = args[i] if i < len(args) else kwargs.get(schema.arguments[i].name)
                if not isinstance(t, torch.Tensor):
                    continue
                # The version counter is bumped above this dispatch level, after this returns.
                if i == 0 and name.endswith("_") and len(w) == 1:
                    n = Node(func, a_nodes, k_nodes, None, t._version + 1, rng=rng, inplace=True, pos=pos)
                    n.flops, n.touched = flops, touched
                else:  # out= and the like: what it now holds is opaque
                    n = Node(None, (), {}, None, t._version + 1, ext=weakref.ref(t))
                setattr(t, ATTR_NODE, n)
            return out
        if func is torch.ops.aten.empty_like.default and isinstance(out, torch.Tensor):
            # Only the input's layout matters (dropout's mask starts so): no data dependency.
            self._cost(func, args, kwargs, out, view=True)
            n = Node(torch.ops.aten.empty_strided.default, (tuple(out.shape), tuple(out.stride())),
                     {"dtype": out.dtype, "device": out.device}, None, out._version, pos=pos)
            setattr(out, ATTR_NODE, n)
            return out
        views = alias_flags(func, args, kwargs, out)
        flops, touched = self._cost(func, args, kwargs, out, view=all(views))
        for key, o, version in produced(func, args, out):
            i = key or 0
            n = Node(func, a_nodes, k_nodes, key, version, rng=rng, view=views[i], pos=pos)
            n.flops, n.touched = flops, touched
            setattr(o, ATTR_NODE, n)
        return out
