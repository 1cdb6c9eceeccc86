"""paged_activations on what users run : torch.compile, small saved tensors sharing
pages, a backward in a tight space or over a retained graph, a full host pool, a budget above
the capacity, and the census that sizes a space.

- under ``torch.compile`` (aot_eager, and inductor on CPU) with the default ``recompute="auto"``
  the hooks run as Python, and gradients equal the compiled model's without the pager;
- small saved tensors are packed densely: the bytes the space moves per planned step are the
  bytes the plan pages (out and back), and ``step_bytes_paged`` is what the space moved;
- a backward makes room by moving what nothing but the pager holds (finished-with values of a
  retained graph, tensors needed later) before it fails; one that truly cannot fit fails at the
  next forward, saying what it needs;
- a full host pool is counted and warned about; a budget above the capacity is refused.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest

torch = pytest.importorskip("torch")

from vtalloc.allocator import AddressSpace, InvalidArgumentError, OutOfMemoryError  # noqa: E402
from vtalloc.allocator.torch import PagerWarning, paged_activations, saved_census  # noqa: E402
from helpers.sizes import MiB  # noqa: E402

KiB = 1024


def _grads(model, steps, ctx, make_x):
    out = []
    for i in range(steps):
        model.zero_grad(set_to_none=True)
        with ctx:
            loss = model(make_x(i)).square().mean()
        loss.backward()
        out.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    return out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own, importing inductor (torch.jit)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_pages_with_the_default_recompute(backend):
    """Dynamo traced the pack hook (called from operations it ran eagerly in the recorded
    iteration) and failed: AttributeError 'NoneType' object has no attribute 'is_leaf'."""
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    compiled = torch.compile(model, backend=backend)
    xs = [torch.randn(512, 256, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    reference = _grads(compiled, 3, contextlib.nullcontext(), xs.__getitem__)
    with AddressSpace(backend="host", capacity="16MiB", host_capacity="64MiB") as space:
        pager = paged_activations(space, budget="256KiB")  # recompute="auto", the default
        got = _grads(compiled, 3, pager, xs.__getitem__)
        st = pager.stats()
        assert st.packed > 0 and st.offloads > 0 and st.fallback_iterations == 0, st
        del pager
    for a, b in zip(reference, got):
        if backend == "aot_eager":  # the same aten operations: bit for bit
            assert all(torch.equal(x, y) for x, y in zip(a, b))
        else:  # inductor fuses differently where the recorded iteration ran the operations one by one
            for x, y in zip(a, b):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def _tanh_chain(n=32):
    torch.manual_seed(0)
    ws = [torch.randn(256, 256, requires_grad=True) for _ in range(n)]

    def forward(x):
        for w in ws:
            x = torch.tanh(x @ w)  # tanh saves its 256 KiB output, the next matmul saves the same tensor
        return x.sum()

    return ws, forward


@pytest.mark.parametrize("mode", ["copy", "mapped"])
@pytest.mark.parametrize("recompute", ["off", "auto"])
def test_small_saved_tensors_move_their_bytes_not_whole_pages(mode, recompute):
    """32 saved tensors of 256 KiB on 2 MiB pages: each took pages of its own and moved them, so
    the space moved 96 MiB per step while the pager reported 12.5 (and the plan paged 6.25 MiB,
    12.5 out and back). Now the bytes moved are the plan's, and the count is the space's."""
    ws, forward = _tanh_chain()
    with AddressSpace(backend="host", capacity="64MiB", host_capacity="256MiB", evict_mode=mode) as space:
        assert space.page_bytes == 2 * MiB
        pager = paged_activations(space, budget="2MiB", recompute=recompute)
        for step in range(4):
            x = torch.randn(256, 256, generator=torch.Generator().manual_seed(step))
            before = space.stats()
            with pager:
                loss = forward(x)
            loss.backward()
            after = space.stats()
            moved = (after.bytes_evicted_total - before.bytes_evicted_total
                     + after.bytes_restored_total - before.bytes_restored_total)
            st = pager.stats()
            assert st.step_bytes_paged == moved, (step, st.step_bytes_paged, moved)
            if step > 0:  # steps that follow the plan made from the first
                planned = 2 * pager.plan().summary.paged_bytes
                assert 0 < moved <= 1.1 * planned, (step, moved, planned)
        del pager


def _mlp_steps(model, pager, steps=2, retain=False):
    out = []
    for i in range(steps):
        model.zero_grad(set_to_none=True)
        x = torch.randn(512, 256, generator=torch.Generator().manual_seed(i))
        with pager:
            loss = model(x).square().mean()
        if retain:
            loss.backward(retain_graph=True)
        loss.backward()
        out.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    return out


def _mlp():
    torch.manual_seed(2)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU()) for _ in range(12)])


def test_a_retained_graph_backward_twice_makes_room_from_finished_values():
    """backward(retain_graph=True) then backward(): the first backward's values stayed pinned
    (autograd's records live on), so the space filled with what backward had finished with and a
    restore failed with most of the space evictable."""
    model = _mlp()
    reference = _mlp_steps(model, contextlib.nullcontext(), retain=True)
    saved = saved_census(lambda: model(torch.randn(512, 256)).square().mean()).bytes
    with AddressSpace(backend="host", capacity=6 * MiB, host_capacity=256 * MiB, page_size="256KiB",
                      host_granularity="256KiB") as space:
        assert saved > 2 * space.capacity_bytes
        pager = paged_activations(space, budget="2MiB")
        got = _mlp_steps(model, pager, retain=True)
        assert pager.stats().room_offloads > 0
        del pager
    assert all(all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(reference, got))


@pytest.mark.parametrize("mode", ["copy", "mapped"])
def test_a_backward_in_a_tight_space_moves_what_it_can_before_failing(mode):
    """A budget close to the capacity: the forward fits, and backward restores by moving out the
    tensors it needs last instead of failing with evictable memory left."""
    model = _mlp()
    reference = _mlp_steps(model, contextlib.nullcontext(), steps=3)
    with AddressSpace(backend="host", capacity=3 * MiB, host_capacity=256 * MiB, page_size="256KiB",
                      host_granularity="256KiB", evict_mode=mode) as space:
        pager = paged_activations(space, budget=int(2.5 * MiB))
        got = _mlp_steps(model, pager, steps=3)
        assert pager.stats().passed_through_no_room == 0
        del pager
    assert all(all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(reference, got))


def test_a_step_that_cannot_fit_fails_at_its_forward_saying_what_it_needs():
    """Three 1 MiB tensors one backward operation reads at once cannot share a 2.5 MiB space:
    the first backward finds no room (nothing else may move); the next step fails at its forward."""
    torch.manual_seed(3)
    a, b, c = (torch.randn(512, 512, requires_grad=True) for _ in range(3))

    def forward():
        return torch.lerp(a * 1.0, b * 1.0, c * 1.0).sum()  # lerp saves its three 1 MiB inputs

    with AddressSpace(backend="host", capacity="2560KiB", host_capacity="64MiB", page_size="256KiB",
                      host_granularity="256KiB") as space:
        pager = paged_activations(space, budget="1MiB", recompute="off")
        with pager:
            loss = forward()
        with pytest.raises(OutOfMemoryError, match="needs at least"):
            loss.backward()
        del loss
        with pytest.raises(OutOfMemoryError, match="backward holds 3.00 MiB"):
            with pager:
                loss = forward()
        del loss, pager


def test_a_full_host_pool_is_counted_and_warned_never_silent():
    """The host pool full: tensors stayed resident beyond the budget with no counter and no warning."""
    model = _mlp()
    with AddressSpace(backend="host", capacity=32 * MiB, host_capacity="1MiB", page_size="256KiB",
                      host_granularity="256KiB") as space:
        pager = paged_activations(space, budget="1MiB", recompute="off")
        with pytest.warns(PagerWarning, match="host pool is full"):
            _mlp_steps(model, pager, steps=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once per pager, counted every time
            _mlp_steps(model, pager, steps=1)
        assert pager.stats().host_pool_full >= 2
        del pager


def test_a_budget_above_the_capacity_is_refused():
    with AddressSpace(backend="host", capacity="4MiB") as space:
        with pytest.raises(InvalidArgumentError, match="above the capacity"):
            paged_activations(space, budget="8MiB")
        assert paged_activations(space, budget="4MiB").budget == 4 * MiB


def test_the_census_counts_what_the_pager_takes():
    torch.manual_seed(4)
    lin = torch.nn.Linear(256, 512)
    x = torch.randn(128, 256, requires_grad=True)
    rng = torch.get_rng_state()
    census = saved_census(lambda: torch.nn.functional.dropout(lin(x).relu(), 0.5).sum())
    assert torch.equal(torch.get_rng_state(), rng)  # the training that follows draws the same numbers
    # relu saves its output (256 KiB) and dropout its mask (256 KiB): taken. Linear saves x (a
    # leaf that requires grad, as a parameter is) and weight.t() (a view of a parameter): left.
    assert census.count == 2 and census.bytes == 512 * KiB and census.largest == 256 * KiB, census
    assert census.left_count == 2 and census.left_bytes == (128 + 512) * KiB, census
    assert census.space_bytes(budget=census.bytes // 4, page_bytes=256 * KiB) % (256 * KiB) == 0
