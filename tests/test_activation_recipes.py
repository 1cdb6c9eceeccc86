"""The recipes paged_activations recomputes, kind by kind, and what keeps them exact without the
recorder: layer norm outputs, matmuls over views and transposes of saved tensors and
parameters, attention (with its dropout), in fp32 and under bf16 autocast; later iterations
run the trace check, not the recorder, and fall back to paging where it cannot prove a recipe
(another operation, another random draw, another constant), with gradients bit-identical
throughout. These tests plan every verified recipe (``every_recipe_planned``): they are of the
recipes and their check, not of the cost model's choices."""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from vtalloc.allocator import AddressSpace  # noqa: E402
from vtalloc.allocator.torch import paged_activations  # noqa: E402
from vtalloc.allocator.torch import activation_paging, activation_recorder  # noqa: E402
from helpers.sizes import MiB  # noqa: E402
from test_activation_recompute import SLOW_LINK, run, same  # noqa: E402  (one training loop for both files)


def space():
    return AddressSpace(backend="host", capacity=64 * MiB, host_capacity=256 * MiB, page_size="256KiB",
                        host_granularity="256KiB")


def recomputed_ops(pager):
    """The operations of the recipes the plan recomputes (their templates, as later iterations run them)."""
    return {e[0] if e[0] != "op" else e[1]._schema.name.split("::")[-1]
            for t in pager._replay.templates.values() for e in t.prog}


@contextlib.contextmanager
def every_recipe_planned():
    """The plan recomputes every tensor with a verified recipe (whatever the cost model prefers)."""
    real = activation_paging.plan_activations

    def plan(cands, budget, *args, **kwargs):
        p = real(cands, budget, *args, **kwargs)
        rows = tuple(dataclasses.replace(r, decision="recompute") if c.recomputable and r.decision != "shared" else r
                     for c, r in zip(cands, p.rows))
        return dataclasses.replace(p, rows=rows)

    with mock.patch.object(activation_paging, "plan_activations", plan):
        yield


@contextlib.contextmanager
def recomputed_exactly(train, model, x, reference, *, autocast, name, equal=same):
    """Trains ``model`` under a pager that recomputes every verified recipe
    (``train(model, x, pager, autocast=...)``, as the reference ran without one) and checks what
    every recipe test asks: results ``equal`` to the reference's, no recipe fell back to paging,
    bytes recomputed and the trace check run. Yields the pager, its stats and the recomputed
    operations while the space is still open."""
    with space() as sp, every_recipe_planned():
        pager = paged_activations(sp, budget=64 * 1024, cost_model=SLOW_LINK)
        got = train(model, x, pager, autocast=autocast)
        st = pager.stats()
        assert equal(got, reference), name
        assert st.recompute_fallbacks == 0 and st.fallback_iterations == 0, st
        assert st.step_bytes_recomputed > 0 and st.step_checked_ops > 0, st
        yield pager, st, recomputed_ops(pager)
        del pager  # the caller drops its own: the pager goes before its space closes


class Attention(nn.Module):
    """Pre-norm self-attention written out: a layer norm, one projection to q, k, v split by
    views, attention with dropout, the heads transposed back and a projection, and an MLP."""

    def __init__(self, d=64, heads=4, p=0.0):
        super().__init__()
        self.d, self.h, self.p = d, heads, p
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.h, d // self.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x).transpose(0, 1)).transpose(0, 1)))


def models():
    torch.manual_seed(0)
    x = torch.randn(4, 32, 64)
    yield "attention", nn.Sequential(Attention(), Attention()), x, False
    yield "attention_dropout", nn.Sequential(Attention(p=0.2), Attention(p=0.2)), x, False
    yield "attention_bf16", nn.Sequential(Attention(), Attention()), x, True
    yield "encoder_layer_dropout", nn.Sequential(
        *[nn.TransformerEncoderLayer(64, 4, 256, dropout=0.1, batch_first=True) for _ in range(2)]), x, False
    yield "encoder_layer_bf16", nn.Sequential(
        *[nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True) for _ in range(2)]), x, True


# What each model's plan must recompute (at a cap of the whole forward): layer norm from its saved
# input, matmuls over views of saved tensors and parameters, attention from its saved q, k, v.
# CPU attention runs the flash kernel, or with dropout the math path (bmm, softmax, dropout).
MATMULS = {"addmm", "mm", "bmm"}


def attention(ops):
    return "_scaled_dot_product_flash_attention_for_cpu" in ops or ("bmm" in ops and ops & {"_softmax", "_safe_softmax"})




@pytest.mark.parametrize("name,model,x,autocast", list(models()), ids=lambda v: v if isinstance(v, str) else "")
def test_each_recipe_kind_recomputes_bit_exact(name, model, x, autocast):
    reference = run(model, x, contextlib.nullcontext(), autocast=autocast)
    with recomputed_exactly(run, model, x, reference, autocast=autocast, name=name) as (pager, st, ops):
        assert "native_layer_norm" in ops and ops & MATMULS and attention(ops), (name, sorted(ops), str(pager.plan()))
        if autocast:
            assert "_to_copy" in ops  # the casts autocast inserted are replayed as the forward ran them
        if "dropout" in name:
            rng = [e for t in pager._replay.templates.values() for e in t.prog if e[0] == "op" and e[5] is not None]
            assert rng, "no random operation was recomputed"
        del pager


def test_later_iterations_run_the_trace_check_not_the_recorder(monkeypatch):
    calls = []
    orig = activation_recorder.Recorder.__torch_dispatch__

    def counting(self, func, types, args=(), kwargs=None):
        calls.append(func)
        return orig(self, func, types, args, kwargs)

    monkeypatch.setattr(activation_recorder.Recorder, "__torch_dispatch__", counting)
    torch.manual_seed(0)
    model, x = nn.Sequential(Attention(p=0.1)), torch.randn(4, 32, 64)
    reference = run(model, x, contextlib.nullcontext())
    with space() as sp, every_recipe_planned():
        pager = paged_activations(sp, budget=64 * 1024, cost_model=SLOW_LINK)
        seen = []

        class Count:  # the pager's context, noting the recorder's calls so far at each exit
            def __init__(self, inner):
                self.inner = inner

            def __enter__(self):
                return self.inner.__enter__()

            def __exit__(self, *exc):
                self.inner.__exit__(*exc)
                seen.append(len(calls))

        assert same(run(model, x, Count(pager)), reference)
        assert seen[0] > 50  # the recorded iteration saw every operation
        assert seen[1] == seen[2] == seen[0], f"a later iteration ran the recorder: {seen}"
        st = pager.stats()
        assert st.step_bytes_recomputed > 0 and st.recompute_fallbacks == 0, st
        # the check watched the operations of its windows (here nearly all: every recipe planned)
        assert 0 < st.step_checked_ops <= seen[0]
        del pager


class Switch(nn.Module):
    """The same shapes every iteration, computed otherwise on some: the pack order (shapes and
    dtypes) does not change, so only the trace check can tell."""

    def __init__(self, d=512):
        super().__init__()
        self.fc1, self.fc2, self.ln = nn.Linear(d, d), nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x, step):
        h = self.fc1(x)
        if step == 2:
            h = F.silu(h)   # iteration 2: another activation
        else:
            h = F.gelu(h)
        if step == 3:
            torch.rand(7)   # iteration 3: a random draw before dropout (the mask's state moves)
        h = F.dropout(h, 0.3, training=True)
        h = self.ln(h)
        eps_step = step == 4  # iteration 4: layer norm with another eps (same shapes, other values)
        return self.fc2(F.layer_norm(h, h.shape[-1:], eps=1e-3 if eps_step else 1e-5))


def test_a_diverging_iteration_pages_what_its_recipes_do_not_reproduce():
    torch.manual_seed(0)
    model, x = Switch(), torch.randn(256, 512)
    reference = run(model, x, contextlib.nullcontext(), steps=6, step_arg=True)
    with space() as sp, every_recipe_planned():
        pager = paged_activations(sp, budget=64 * 1024, cost_model=SLOW_LINK)
        diverged = []
        for i in range(6):
            model.zero_grad(set_to_none=True)
            torch.manual_seed(100 + i)
            before = pager.stats().recompute_diverged
            with pager:
                loss = model(x, i).float().square().mean()
            loss.backward()
            diverged.append(pager.stats().recompute_diverged - before)
            assert torch.equal(loss, reference[i][0]), i
            assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), reference[i][1])), i
        st = pager.stats()
        assert st.fallback_iterations == 0  # the pack order never changed
        assert diverged[1] == 0 and diverged[5] == 0, diverged  # the recorded path: every recipe reproduced
        assert diverged[2] > 0 and diverged[3] > 0 and diverged[4] > 0, (diverged, str(pager.plan()))
        assert st.step_bytes_recomputed > 0  # iteration 5 recomputes again
        del pager


class WarmUp(nn.Module):
    """Builds a table on its first call only (as models that cache rotary tables do): the
    recorded iteration runs operations no later one runs, so every position after them shifts."""

    def __init__(self, d=256):
        super().__init__()
        self.fc1, self.fc2, self.table = nn.Linear(d, d), nn.Linear(d, d), None

    def forward(self, x):
        if self.table is None:
            self.table = torch.linspace(0.5, 1.5, x.shape[-1]).exp()
        return self.fc2(F.layer_norm(F.gelu(self.fc1(x)) * self.table, x.shape[-1:]))


def test_a_recorded_warm_up_iteration_is_recorded_again_once_the_next_one_runs_otherwise():
    torch.manual_seed(0)
    model, x = WarmUp(), torch.randn(128, 256)
    reference = run(model, x, contextlib.nullcontext(), steps=5)
    model.table = None
    with space() as sp, every_recipe_planned():
        pager = paged_activations(sp, budget=64 * 1024, cost_model=SLOW_LINK)
        diverged = []
        for i in range(5):
            before = pager.stats().recompute_diverged
            got = run(model, x, pager, steps=1)
            diverged.append(pager.stats().recompute_diverged - before)
            assert same(got, reference[i:i + 1]), i
        st = pager.stats()
        # 0 records (with the table), 1 runs otherwise: 2 records again, 3 and 4 follow its plan
        assert st.replans == 1 and diverged[1] > 0 and diverged[3] == diverged[4] == 0, (diverged, st)
        assert st.step_bytes_recomputed > 0
        del pager


def test_a_saved_input_is_a_source_and_a_permuted_tensor_keeps_its_strides():
    # Autograd packs an operation's inputs before the operation runs: the batch a convolution
    # saves is packed before the recorder sees it, and is still the source of the ReLU after it.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 16 * 16, 4)).to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    reference = run(model, x, contextlib.nullcontext())
    with space() as sp, every_recipe_planned():
        pager = paged_activations(sp, budget=64 * 1024, cost_model=SLOW_LINK)
        assert same(run(model, x, pager), reference)
        sources = {s for t in pager._replay.templates.values() for e in t.prog if e[0] == "saved" for s in [e[1]]}
        assert 0 in sources, str(pager.plan())  # pack 0 is the batch
        t = torch.randn(4, 8, 16).transpose(0, 2)
        handle, nbytes = pager.pager.pack(t)
        back = pager.pager.unpack(handle)
        assert back.stride() == t.stride() and torch.equal(back, t) and nbytes == t.numel() * 4
        del pager, handle, back


def test_a_segment_runs_each_recomputed_tensor_once_and_holds_the_rest_until_unpacked():
    # A chain recomputed whole from its kept input: the first unpack in backward rebuilds the
    # chain, each tensor's own operations once, and holds what backward unpacks later; a
    # step's recomputed FLOPs are the plan's, not a run per reader.
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256)) for _ in range(4)])
    x = torch.randn(256, 256)
    reference = run(model, x, contextlib.nullcontext())
    with space() as sp:
        pager = paged_activations(sp, budget=MiB, cost_model=SLOW_LINK)
        assert same(run(model, x, pager), reference)
        plan, st = pager.plan(), pager.stats()
        assert plan.summary.segments >= 1 and plan.summary.largest_segment_bytes > 2 * 256 * 1024, str(plan)
        assert st.step_recompute_flops == plan.summary.recompute_flops, (st, str(plan))
        assert st.recompute_fallbacks == 0
        del pager


def test_plan_rows_say_why_a_tensor_has_no_recipe():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)), torch.randn(256, 64)
    with space() as sp:
        pager = paged_activations(sp, budget=16 * 1024)
        run(model, x, pager, steps=1)
        plan = pager.plan()
        first = plan.rows[0]  # the batch, saved by the first linear: nothing made it in the forward
        assert first.why and "outside" in first.why, str(plan)
        assert "no recipe" in str(plan)
        del pager
