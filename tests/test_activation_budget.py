"""The default budget of paged_activations: the capacity less the model's own memory, measured in
the recorded iteration (what the pager's memory holds beyond the saved tensors, and what it holds
more once the optimizer made its state); an explicit budget wins; nothing measured, half the
capacity stays."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from vtalloc.allocator import AddressSpace  # noqa: E402
from vtalloc.allocator.torch import paged_activations  # noqa: E402
from vtalloc.allocator.torch.activation_budget import BudgetMeter  # noqa: E402
from helpers.sizes import MiB  # noqa: E402

PAGE = 256 * 1024


def space():
    return AddressSpace(backend="host", capacity=32 * MiB, host_capacity=256 * MiB, page_size="256KiB",
                        host_granularity="256KiB")


def steps(pager, sp, model, x, n, own_after_first=None):
    """``n`` steps; after the first, the 'optimizer' makes its state in the pager's memory."""
    held = []
    for i in range(n):
        model.zero_grad(set_to_none=True)
        with pager:
            loss = model(x).square().mean()
        loss.backward()
        if i == 0 and own_after_first:
            held.append(sp.tensor((own_after_first // 4,), torch.float32))
    return held


def test_the_default_budget_is_the_capacity_less_what_the_model_holds():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)) for _ in range(4)])
    x = torch.randn(256, 256)
    with space() as sp:
        weights = sp.tensor((2 * MiB // 4,), torch.float32)  # the model's own, in the pager's memory
        pager = paged_activations(sp)
        assert pager.budget == 16 * MiB  # the recorded iteration runs with half the capacity
        state = steps(pager, sp, model, x, 3, own_after_first=3 * MiB)
        meter = pager._meter
        expect = 32 * MiB - (2 + 3) * MiB - 2 * meter.largest
        # what offloaded pages may hold, where the plan pages, comes off too
        paged = pager.plan().summary.paged_bytes
        expect -= 2 * min(max(expect, 0) // 4, paged) if paged else 0
        assert meter.largest == 512 * 256 * 4
        assert expect - 2 * PAGE <= pager.budget <= expect, (pager.budget, expect, meter.own)
        assert pager.stats().budget_bytes == pager.budget
        del pager, weights, state


def test_an_explicit_budget_wins():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    with space() as sp:
        pager = paged_activations(sp, budget="1MiB")
        steps(pager, sp, model, torch.randn(256, 256), 2)
        assert pager.budget == MiB and pager._meter is None
        del pager


def test_a_pager_that_cannot_say_what_it_holds_keeps_half_the_capacity():
    class Blind:
        pass

    meter = BudgetMeter(Blind(), 8 * MiB)
    meter.begin()
    meter.sample(0, MiB)
    assert meter.budget() is None  # the caller keeps its provisional budget

    class Full:
        def footprint(self):
            return 8 * MiB, 9 * MiB  # holds more than its capacity: the budget is not negative

    meter = BudgetMeter(Full(), 8 * MiB)
    meter.begin()
    meter.sample(0, MiB)
    assert meter.budget() == 1
