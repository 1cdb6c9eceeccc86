"""The training part of `vtalloc demo`: a small model trained with its memory served by vtalloc.

Owns: the demo model and loop, and where it runs. On a GPU (vtalloc's cuda backend usable and
torch sees CUDA) the training runs in fresh interpreters, once with PyTorch's native allocator
and once under ``vtalloc.allocator.torch.enable()``, because the allocator can be chosen only
once per process and the CLI's process must stay free of it; the losses are compared. Without
a GPU it runs here on CPU tensors over a host-backend address space: parameters and the input
live in the space's pages, and every activation autograd saves for backward is paged through
it by ``paged_activations`` within a small budget (evicted to host memory behind the forward
pass, prefetched ahead of the backward pass); the same training on plain CPU tensors is the
reference. Either way the report carries vtalloc's page stats.
Invariant: nothing is left allocated when a run returns.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from vtalloc.allocator import AddressSpace, BackendUnavailableError, InvalidArgumentError, backend_available, format_size
from vtalloc.allocator import backends
from vtalloc.allocator.extras import import_torch

_NEEDS_TORCH = "vtalloc demo's training (--no-train skips it)"

__all__ = ["TrainReport", "run_train_demo", "describe_train", "report_dict", "PAGE_STAT_KEYS"]

WIDTH, HIDDEN, CLASSES, BATCH, LR = 512, 1024, 10, 256, 0.05
PAGE_STAT_KEYS = (
    "pages_total", "pages_mapped", "mapped_bytes", "peak_mapped_bytes", "active_bytes", "peak_active_bytes",
    "num_allocs", "num_frees", "num_page_reclaims", "evictions", "restores", "bytes_evicted_total",
)
ACTIVATION_BUDGET = 2 << 20  # bytes of saved activations kept resident on CPU: the rest is evicted


@dataclass(frozen=True)
class TrainReport:
    device: str                   # "cuda" or "cpu"
    placement: str                # what lived in vtalloc's memory
    steps: int
    losses: list[float]
    reference: str                # what the losses were compared with
    identical_to_reference: bool
    stats: dict[str, int]         # vtalloc Stats after the last step, the model still alive
    saved_activation_bytes: int   # host run: bytes of activations placed in the space (0 on GPU)
    paging: dict[str, Any] | None = None  # host run: paged_activations' stats


def _model(torch: Any) -> Any:
    return torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )


def _loss(torch: Any, logits: Any, target: Any) -> Any:
    # cross-entropy from log_softmax and a one-hot mask: deterministic on CUDA too (NLLLoss is not)
    onehot = torch.nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)
    return -(torch.log_softmax(logits, dim=-1) * onehot).sum(dim=-1).mean()


def _sgd(torch: Any, model: Any) -> None:
    with torch.no_grad():  # in place, so parameters placed in a space stay there
        for p in model.parameters():
            p -= LR * p.grad
            p.grad = None


# -- CPU over a host-backend space ---------------------------------------------------------------

def _place_parameters(space: AddressSpace, model: Any, torch: Any) -> None:
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            placed = space.tensor(p.shape, dtype=p.dtype)
            placed.copy_(p.detach())
            setattr(module, name, torch.nn.Parameter(placed))


def _train_on_host(capacity: int | str, steps: int, backend: str = "host") -> TrainReport:
    torch = import_torch(_NEEDS_TORCH)

    torch.manual_seed(0)
    plain = _model(torch)
    x = torch.randn(BATCH, WIDTH)
    y = torch.randint(0, CLASSES, (BATCH,))
    losses, reference_losses = [], []
    from vtalloc.allocator.torch import paged_activations

    with AddressSpace(backend=backend, capacity=capacity) as space:
        paged = _model(torch)
        paged.load_state_dict(plain.state_dict())
        _place_parameters(space, paged, torch)
        xs = space.tensor(x.shape)
        xs.copy_(x)
        pager = paged_activations(space, budget=ACTIVATION_BUDGET)

        identical = True
        for _ in range(steps):
            ref = _loss(torch, plain(x), y)
            ref.backward()
            with pager:  # saved activations go to the space, evicted behind and prefetched ahead
                loss = _loss(torch, paged(xs), y)
            loss.backward()
            identical &= torch.equal(ref, loss) and all(
                torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), paged.parameters())
            )
            reference_losses.append(ref.item())
            losses.append(loss.item())
            _sgd(torch, plain)
            _sgd(torch, paged)
        stats = space.stats().as_dict()
        paging = asdict(pager.stats())
        del paged, xs, loss, pager
    return TrainReport(
        device="cpu",
        placement="parameters, input and saved activations in a host-backend address space",
        paging=paging,
        steps=steps, losses=losses, reference="the same training on plain CPU tensors",
        identical_to_reference=identical and losses == reference_losses,
        stats={k: stats[k] for k in PAGE_STAT_KEYS}, saved_activation_bytes=paging["packed_bytes"],
    )


# -- GPU, in fresh interpreters ----------------------------------------------------------------------

def _gpu_worker(allocator: str, steps: int) -> dict[str, Any]:
    import torch

    vt: Any = None
    if allocator == "vtalloc":
        import vtalloc.allocator.torch as vt

        vt.enable()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = _model(torch).cuda()
    x = torch.randn(BATCH, WIDTH, device="cuda")
    y = torch.randint(0, CLASSES, (BATCH,), device="cuda")
    losses = []
    for _ in range(steps):
        loss = _loss(torch, model(x), y)
        loss.backward()
        _sgd(torch, model)
        losses.append(loss.item())
    out: dict[str, Any] = {"losses": losses}
    if vt is not None:
        out["stats"] = vt.stats().as_dict()
        b = vt.binding()
        out["binding"] = b.kind if b.reason is None else f"{b.kind} ({b.reason})"
    return out


def _run_worker(allocator: str, steps: int) -> dict[str, Any]:
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    cmd = [sys.executable, "-m", "vtalloc.client.train_demo", "--worker", allocator, "--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"the {allocator} training run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _train_on_gpu(steps: int) -> TrainReport:
    native = _run_worker("native", steps)
    paged = _run_worker("vtalloc", steps)
    return TrainReport(
        device="cuda",
        placement=f"every CUDA tensor (vtalloc.allocator.torch.enable(), {paged.get('binding')} binding)",
        steps=steps, losses=paged["losses"], reference="the same training with PyTorch's native allocator",
        identical_to_reference=paged["losses"] == native["losses"],
        stats={k: paged["stats"][k] for k in PAGE_STAT_KEYS}, saved_activation_bytes=0,
    )


def _torch_cuda() -> tuple[bool, str]:
    torch = import_torch(_NEEDS_TORCH)

    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} reports torch.cuda.is_available() == False"
    return backend_available("cuda")


def run_train_demo(backend: str = "auto", steps: int = 10, capacity: int | str = "64MiB") -> TrainReport:
    """Train the demo MLP for ``steps`` steps: on a GPU under vtalloc (a backend of device memory,
    or "auto" when one is usable), else on CPU tensors over a space of ``capacity`` of a backend of
    host memory ("host", or "auto" without a GPU)."""
    choices = backends.choices()  # "auto" and the core's registered backends
    if backend not in choices:
        raise InvalidArgumentError(f"backend must be one of {', '.join(choices)}, got {backend!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 10_000:
        raise InvalidArgumentError(f"steps must be an integer in 1..10000, got {steps!r}")
    if backend != "auto" and not backends.by_name(backend).device_memory:
        return _train_on_host(capacity, steps, backend)
    ok, why = _torch_cuda()
    if ok:
        return _train_on_gpu(steps)
    if backend != "auto":
        raise BackendUnavailableError(f"cannot train on a GPU here: {why}")
    return _train_on_host(capacity, steps)


def describe_train(report: TrainReport) -> list[str]:
    s = report.stats
    lines = [
        f"trained a {WIDTH}-{HIDDEN}-{HIDDEN}-{CLASSES} MLP for {report.steps} steps on {report.device}; "
        f"vtalloc held {report.placement}",
        f"loss {report.losses[0]:.4f} -> {report.losses[-1]:.4f}; identical to {report.reference}: "
        f"{report.identical_to_reference}",
    ]
    if report.saved_activation_bytes:
        lines.append(f"{format_size(report.saved_activation_bytes)} of activations were saved for backward in the space")
    if report.paging:
        p = report.paging
        lines.append(
            f"paged_activations kept at most {format_size(p['budget_bytes'])} of them resident: {p['offloads']} offloads"
            f" behind the forward pass, {p['prefetches']} prefetches ahead of backward, {p['on_demand']} on-demand"
            f" restores; {s['evictions']} pages evicted and {s['restores']} restored"
            f" ({format_size(s['bytes_evicted_total'])} moved to host memory and back, same addresses)"
        )
    lines.append(
        f"after the last step: {s['pages_mapped']} of {s['pages_total']} pages mapped ({format_size(s['mapped_bytes'])},"
        f" peak {format_size(s['peak_mapped_bytes'])}), {s['num_allocs']} allocations and {s['num_frees']} frees served"
    )
    return lines


def report_dict(report: TrainReport) -> dict[str, Any]:
    return asdict(report)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="worker of `vtalloc demo` for the GPU training run (internal)")
    p.add_argument("--worker", choices=("native", "vtalloc"), required=True)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args(argv)
    print(json.dumps(_gpu_worker(args.worker, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
