"""offload_peers: the peers bench_offload_training.py measures vtalloc against, and what they cost in the model.

Owns: per-block activation checkpointing (``checkpoint``), per-block checkpointing whose kept
block inputs and the rest of what is saved go to pinned host memory (``checkpoint_offload``: the
reentrant checkpoint saves its inputs through the outer ``save_on_cpu`` hooks; the peer that
fits ResNet-50 at 4x the native batch under 16 GiB, where per-block checkpointing keeps too
many block inputs on the device), ``torch.compile`` with the min-cut partitioner's activation
memory budget (``compile``); :class:`RecomputeCount`, which counts the operations
checkpointing runs again in backward (the ones run with grad enabled inside backward) and what
they cost on a cost model; and :func:`calibrate`, the constants of the cost model measured on a
GPU (copy link, matmul and memory rates, launch, a dispatch mode's cost per operation).
The configuration names (``GPU_CONFIGS``, ``CPU_CONFIGS``, ``REFERENCE_ORDER``, ``RUN_ORDER``,
``PAGER_CONFIGS``), the stream-overlapped offloader (:class:`StreamOffloader`, the strongest
simple baseline) and ``counted_save_on_cpu`` (torch's ``save_on_cpu`` counting what it copies).
Invariants: a peer keeps the model's parameters and their order (gradients compare one to one);
nothing here is a measurement until a run writes it.
"""

from __future__ import annotations

import time
from typing import Any

from lib.training_models import HF_MODELS

MiB = 1 << 20
GPU_CONFIGS = ["native", "expandable", "save_on_cpu", "offloader", "checkpoint", "checkpoint_offload", "uncapped",
               "compile", "vtalloc_off", "vtalloc"]
CPU_CONFIGS = ["native", "save_on_cpu", "offloader", "checkpoint", "vtalloc_off", "vtalloc"]
REFERENCE_ORDER = ["native", "uncapped", "save_on_cpu", "offloader", "expandable", "checkpoint", "checkpoint_offload",
                   "compile", "vtalloc_off", "vtalloc"]
# The order runs start in: what the comparison needs first, so a time limit cuts the least useful.
RUN_ORDER = ["vtalloc", "checkpoint", "uncapped", "native", "checkpoint_offload", "vtalloc_off", "save_on_cpu",
             "offloader", "compile", "expandable"]
PAGER_CONFIGS = {"vtalloc": "auto", "vtalloc_off": "off"}  # config -> paged_activations(recompute=...)


def blocks_of(model: str, net: Any) -> list[tuple[Any, str, int]]:
    """The (container, attribute or index) of each block per-block checkpointing wraps."""
    if model in HF_MODELS:
        return []  # transformers wraps its own layers (gradient_checkpointing_enable)
    if model == "resnet50":
        return [(layer, "", i) for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for i in range(len(layer))]
    if model == "cnn":
        return []  # (conv, relu) pairs: checkpoint_blocks wraps them itself
    import torch

    return [(net, "", i) for i, m in enumerate(net) if isinstance(m, torch.nn.TransformerEncoderLayer)]


def checkpoint_blocks(torch: Any, model: str, net: Any, reentrant: bool = False) -> Any:
    """Full activation checkpointing, one checkpoint per block; parameters (and their order) unchanged."""
    nn = torch.nn

    class Checkpointed(nn.Module):
        """A block run under ``torch.utils.checkpoint`` (full: its activations recomputed in backward)."""

        def __init__(self, block: Any) -> None:
            super().__init__()
            self.block = block

        def forward(self, *args: Any) -> Any:
            from torch.utils.checkpoint import checkpoint

            if reentrant:  # the reentrant form gives no gradients to a block whose inputs need none (the batch)
                args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                             and not a.requires_grad else a for a in args)
            return checkpoint(self.block, *args, use_reentrant=reentrant)

    if reentrant:  # its forward runs under no_grad, where TransformerEncoderLayer would take its fused
        torch.backends.mha.set_fastpath_enabled(False)  # path: other values than its recompute, and native's
    if model in HF_MODELS:
        net.lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return net
    if model == "cnn":  # (conv, relu) x 2, then the head
        return nn.Sequential(Checkpointed(nn.Sequential(net[0], net[1])), Checkpointed(nn.Sequential(net[2], net[3])),
                             *list(net)[4:])
    for parent, _, i in blocks_of(model, net):
        parent[i] = Checkpointed(parent[i])
    return net


def compiled(torch: Any, net: Any, budget: float) -> Any:
    """``torch.compile`` whose partitioner keeps at most ``budget`` of the activations' memory
    (``torch._functorch.config.activation_memory_budget``) and recomputes the rest."""
    import torch._functorch.config as functorch_config

    functorch_config.activation_memory_budget = budget
    return torch.compile(net)


class RecomputeCount:
    """A dispatch mode around ``loss.backward()``: the operations run with grad enabled there are
    checkpointing's recompute (the engine runs backward functions with it disabled); ``seconds``
    is what they cost on ``cost_model`` (each: max(device time, one launch); a view, whose
    outputs all alias an input, no device time, one launch of host time: as the plan prices its
    recipes and the recorder the forward)."""

    def __init__(self, cost_model: Any) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        from vtalloc.allocator.torch.activation_recorder import aliases, op_cost

        count = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if torch.is_grad_enabled():
                    flops, touched, _ = op_cost(func, args, kwargs, out, view=aliases(func, args, kwargs, out))
                    count.costs.append((flops, touched))
                    count.ops += 1
                    count.flops += flops
                    count.seconds += cost_model.run_s(flops, touched)
                return out

        self.mode, self.ops, self.flops, self.seconds = Mode(), 0, 0, 0.0
        self.costs: list[tuple[int, int]] = []  # (FLOPs, bytes touched) of each operation run again


def calibrate(torch: Any) -> dict[str, Any]:
    """The cost model's constants on this GPU, measured (about a second): pinned copies of 256 MiB
    each way, a bf16 8192^3 matmul, an in-place add over 512 MiB, a 1-element add (launch), and
    what an empty dispatch mode adds to it (the trace check's floor)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    dev = torch.device("cuda")
    sync = torch.cuda.synchronize

    def timed(fn: Any, reps: int) -> float:
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        return (time.perf_counter() - t0) / reps

    out: dict[str, Any] = {}

    def link() -> None:
        n = 256 << 20
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        buf = torch.empty(n, dtype=torch.uint8, device=dev)
        out["d2h_bytes_per_s"] = n / timed(lambda: host.copy_(buf, non_blocking=True), 5)
        out["h2d_bytes_per_s"] = n / timed(lambda: buf.copy_(host, non_blocking=True), 5)

    def compute() -> None:
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        out["matmul_flops_per_s"] = 2 * 8192 ** 3 / timed(lambda: a @ a, 10)
        e = torch.zeros(256 << 20, device=dev, dtype=torch.bfloat16)
        out["elementwise_bytes_per_s"] = 2 * e.numel() * e.element_size() / timed(lambda: e.add_(1), 10)

    link()
    compute()
    one = torch.zeros(1, device=dev)
    out["launch_s"] = timed(lambda: [one.add_(1) for _ in range(1000)], 3) / 1000

    class Empty(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    def moded() -> None:
        with Empty():
            for _ in range(1000):
                one.add_(1)

    out["dispatch_mode_per_op_s"] = timed(moded, 3) / 1000 - out["launch_s"]
    torch.cuda.empty_cache()
    return out


# -- the stream-overlapped offloader (the strongest simple baseline) -------------------------------

class StreamOffloader:
    """Saved tensors >= ``min_bytes`` go to pinned host buffers on a side stream during forward
    and come back on demand (on the current stream) in backward. On CPU the copies are plain."""

    def __init__(self, min_bytes: int = MiB) -> None:
        import torch

        self.torch, self.min_bytes, self.stream = torch, min_bytes, None
        self.d2h_bytes = self.h2d_bytes = 0

    def hooks(self) -> Any:
        return self.torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: Any) -> Any:
        torch = self.torch
        base = t._base if t._base is not None else t
        nbytes = t.numel() * t.element_size()
        if (base.is_leaf and base.requires_grad) or nbytes < self.min_bytes:
            return t  # parameters stay; small tensors cost more to move than they free
        dense = t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last)
        stride = t.stride() if dense else torch.empty(t.shape, device="meta").stride()
        host = torch.empty_strided(t.shape, stride, dtype=t.dtype, pin_memory=t.is_cuda)
        if t.is_cuda:
            if self.stream is None:
                self.stream = torch.cuda.Stream(t.device)
            self.stream.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(self.stream):
                host.copy_(t, non_blocking=True)
            t.record_stream(self.stream)  # its device memory is reused only after the copy
        else:
            host.copy_(t)
        self.d2h_bytes += nbytes
        return (t.device, host)

    def unpack(self, packed: Any) -> Any:
        if not isinstance(packed, tuple):
            return packed
        device, host = packed
        if device.type != "cuda":
            return host
        self.torch.cuda.current_stream(device).wait_stream(self.stream)
        self.h2d_bytes += host.numel() * host.element_size()
        return host.to(device, non_blocking=True)


def counted_save_on_cpu(torch: Any, moved: dict[str, int]) -> Any:
    """torch's save_on_cpu(pin_memory=True) with its hooks wrapped to count the bytes they copy."""
    ctx = torch.autograd.graph.save_on_cpu(pin_memory=True)
    pack0, unpack0 = ctx.pack_hook, ctx.unpack_hook

    def pack(t: Any) -> Any:
        moved["d2h"] += t.numel() * t.element_size()  # pin_memory=True copies every saved tensor
        return pack0(t)

    def unpack(p: Any) -> Any:
        if p[0].type != "cpu":
            moved["h2d"] += p[1].numel() * p[1].element_size()
        return unpack0(p)

    ctx.pack_hook, ctx.unpack_hook = pack, unpack
    return ctx
