"""Batch norm in training mode under paged_activations(recompute="auto"): conv -> BatchNorm ->
ReLU(inplace) blocks, whose BN/ReLU outputs are rebuilt from the convolution output the batch
norm saved by a call that writes no running statistics; gradients, losses and running
statistics bit-identical to a run without paging after several SGD steps (fp32, channels_last,
bf16 autocast); unpack never touches running_mean, running_var or num_batches_tracked; a call
that would write them is refused when compiled and when run."""

from __future__ import annotations

import contextlib
import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from vtalloc.allocator import SourceChangedError  # noqa: E402
from vtalloc.allocator.torch import paged_activations  # noqa: E402
from vtalloc.allocator.torch.activation_recompute import Recipe  # noqa: E402
from vtalloc.allocator.torch.activation_recorder import writes_running_stats  # noqa: E402
from test_activation_recipes import SLOW_LINK, every_recipe_planned, recomputed_exactly, recomputed_ops, space  # noqa: E402


class Block(nn.Module):
    """conv -> BN -> ReLU(inplace) -> conv -> BN, a residual added in place, ReLU(inplace): a
    ResNet bottleneck's pattern. 256 channels: the running statistics are 1 KiB, so autograd's
    saved copies of them are packed (not passed through as tiny)."""

    def __init__(self, c=256, mid=32, functional=None):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.functional = functional  # None: nn.BatchNorm2d's own path (native_batch_norm on CPU)

    def bn(self, m, x):
        if self.functional is None:
            return m(x)
        m.num_batches_tracked.add_(1)
        if self.functional == "_batch_norm_with_update":
            return torch.ops.aten._batch_norm_with_update(x, m.weight, m.bias, m.running_mean, m.running_var,
                                                          m.momentum, m.eps)[0]
        return torch.ops.aten._native_batch_norm_legit(x, m.weight, m.bias, m.running_mean, m.running_var, True,
                                                       m.momentum, m.eps)[0]

    def forward(self, x):
        y = self.relu(self.bn(self.bn1, self.conv1(x)))
        y = self.bn(self.bn2, self.conv2(y))
        y += x
        return self.relu(y)


def net(functional=None, channels_last=False):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 256, 3, padding=1, bias=False), nn.BatchNorm2d(256), nn.ReLU(inplace=True),
                      Block(functional=functional), Block(functional=functional),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))
    for mod in m.modules():  # BN weights away from 1 and 0: a wrong stand-in would show
        if isinstance(mod, nn.BatchNorm2d):
            nn.init.uniform_(mod.weight, 0.5, 1.5)
            nn.init.uniform_(mod.bias, -0.5, 0.5)
    x = torch.randn(4, 3, 8, 8)
    if channels_last:
        m, x = m.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    return m, x


def stats_of(model):
    """Every batch norm's running_mean, running_var and num_batches_tracked, cloned, with versions."""
    return [(name, b.clone(), b._version) for name, b in model.named_buffers()]


def train(model, x, ctx, steps=4, autocast=False, watch=None):
    """``steps`` SGD steps under ``ctx``: each step's loss, gradients and running statistics after."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with ctx, cast:
            loss = model(x).float().square().mean()
        if watch is not None:
            watch(i)
        loss.backward()
        out.append((loss.detach().clone(), [p.grad.clone() for p in model.parameters()],
                    [b for _, b, _ in stats_of(model)]))
        opt.step()
    return out


def same(a, b):
    return all(torch.equal(la, lb) and all(torch.equal(g, h) for g, h in zip(ga, gb))
               and all(torch.equal(s, t) for s, t in zip(sa, sb)) for (la, ga, sa), (lb, gb, sb) in zip(a, b))


CASES = [("module", None, False, False), ("module_channels_last", None, True, False),
         ("module_bf16", None, False, True), ("batch_norm_with_update", "_batch_norm_with_update", False, False),
         ("native_batch_norm_legit", "_native_batch_norm_legit", False, False)]


@pytest.mark.parametrize("name,functional,channels_last,autocast", CASES, ids=[c[0] for c in CASES])
def test_batch_norm_outputs_recomputed_bit_exact_with_running_stats_identical(name, functional, channels_last,
                                                                              autocast):
    model, x = net(functional, channels_last)
    ref_model = copy.deepcopy(model)
    reference = train(ref_model, x, contextlib.nullcontext(), autocast=autocast)
    with recomputed_exactly(train, model, x, reference, autocast=autocast, name=name,
                            equal=same) as (pager, st, ops):
        assert [(n, v) for n, _, v in stats_of(model)] == [(n, v) for n, _, v in stats_of(ref_model)]
        stand_in = "_native_batch_norm_legit" if functional else "native_batch_norm"
        assert stand_in in ops and "relu_" in ops, (sorted(ops), str(pager.plan()))
        # The BN/ReLU outputs the next convolution and the ReLU save: recomputed, not moved.
        rows = [r for r in pager.plan().rows if r.decision == "recompute" and r.op in ("relu_", stand_in)]
        assert rows, str(pager.plan())
        del pager


def test_unpack_never_touches_running_statistics():
    # Each backward (recomputing BN/ReLU outputs at unpack) leaves the running statistics and
    # num_batches_tracked its forward wrote exactly as they were: values and versions.
    model, x = net()
    with space() as sp, every_recipe_planned():
        pager = paged_activations(sp, budget=64 * 1024, cost_model=SLOW_LINK)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            opt.zero_grad(set_to_none=True)
            with pager:
                loss = model(x).float().square().mean()
            snap = stats_of(model)
            r0 = pager.stats().bytes_recomputed
            loss.backward()
            after = stats_of(model)
            assert [(n, v) for n, _, v in snap] == [(n, v) for n, _, v in after]
            assert all(torch.equal(a, b) for (_, a, _), (_, b, _) in zip(snap, after))
            opt.step()
        assert pager.stats().bytes_recomputed > r0  # the last backward did recompute
        del pager


def test_a_call_writing_running_statistics_is_refused_at_compile_and_at_run():
    x, w, b = torch.randn(2, 4, 3, 3), torch.ones(4), torch.zeros(4)
    rm, rv = torch.zeros(4), torch.ones(4)
    f = torch.ops.aten.native_batch_norm.default
    assert writes_running_stats(f, (x, w, b, rm, rv, True, 0.1, 1e-5), {})
    assert not writes_running_stats(f, (x, w, b, None, None, True, 0.1, 1e-5), {})
    assert not writes_running_stats(f, (x, w, b, rm, rv, False, 0.1, 1e-5), {})  # eval: reads them only
    assert writes_running_stats(f, (x, w, b), {"running_mean": rm, "running_var": rv, "training": True,
                                               "momentum": 0.1, "eps": 1e-5})
    # A recipe that would run it (never compiled so; built by hand) raises, and writes nothing.
    prog = [("saved", None), ("op", f, (_slot(0), w, b, rm, rv, True, 0.1, 1e-5), {}, 0, None, None)]
    recipe = Recipe(prog, ((2, 4, 3, 3), x.stride(), x.dtype, x.device), (), 0, 0, 1)
    with pytest.raises(SourceChangedError, match="running statistics"):
        recipe.run(lambda rec: x)
    assert torch.equal(rm, torch.zeros(4)) and torch.equal(rv, torch.ones(4))


def _slot(i):
    from vtalloc.allocator.torch.activation_recompute import _Slot

    return _Slot(i)


@pytest.mark.parametrize("channels", [256, 64])
def test_eval_mode_batch_norm_is_recomputed_only_from_packed_running_statistics(channels):
    # Eval mode reads the running statistics and writes nothing: recomputed as itself where
    # autograd's saved copies of them are packed (256 fp32 channels: 1 KiB, the pager's
    # min_bytes), not where they are passed through (64 channels: only the buffer, no source).
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                      nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                      nn.Flatten(), nn.Linear(channels * 64, 4))
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            nn.init.uniform_(mod.running_mean, -1, 1)
            nn.init.uniform_(mod.running_var, 0.5, 2)
    m.eval()
    x = torch.randn(4, 3, 8, 8)
    reference = train(copy.deepcopy(m), x, contextlib.nullcontext(), steps=3)
    with space() as sp, every_recipe_planned():
        pager = paged_activations(sp, budget=16 * 1024, cost_model=SLOW_LINK)
        assert same(train(m, x, pager, steps=3), reference)
        assert ("native_batch_norm" in recomputed_ops(pager)) == (channels >= 256), str(pager.plan())
        del pager
