"""Segment recompute against checkpointing: GPT-style stacks at per-block checkpointing's memory,
with the copy link priced out, train bit-identically to no pager while moving at most 5% of
their saved bytes and running again at most 1.1x a forward's FLOPs (recompute and the trace
check together: the check runs none).

How to run it on another model: ``check_against_checkpointing(model, blocks, batch, targets)``
with the model's blocks (the modules per-block checkpointing would wrap) is all the test uses;
``checkpointing_budget`` measures the memory per-block checkpointing holds, as the pager counts it.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from vtalloc.allocator import AddressSpace  # noqa: E402
from vtalloc.allocator.activation_plan import H100, CostModel  # noqa: E402
from vtalloc.allocator.torch import paged_activations  # noqa: E402
from helpers.sizes import MiB  # noqa: E402
from test_activation_recipes import Attention  # noqa: E402

# The H100's model with the copy link priced out: paging a byte costs more than any recompute.
NO_LINK = CostModel(link_bytes_per_s=1e3, peak_flops=H100.peak_flops, mem_bytes_per_s=H100.mem_bytes_per_s,
                    launch_s=H100.launch_s, name="h100, link priced out")
MIN_BYTES = 1024  # paged_activations' default: smaller saved tensors are not the pager's


class GPTBlock(Attention):
    """Pre-norm (the recipe tests' layers): causal self-attention with dropout, a tanh-GELU MLP,
    residual dropout."""

    def forward(self, x):
        b, s, d = x.shape
        heads = (t.view(b, s, self.h, d // self.h).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(*heads, dropout_p=self.p if self.training else 0.0, is_causal=True)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, s, d)), self.p, self.training)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")), self.p, self.training)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    """RMSNorm, attention without biases, a SwiGLU MLP; no dropout."""

    def __init__(self, d: int, heads: int, p: float = 0.0) -> None:
        super().__init__()
        self.h = heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, 3 * d, bias=False), \
            nn.Linear(3 * d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.n1(x)
        q, k, v = (m(h).view(b, s, self.h, d // self.h).transpose(1, 2) for m in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class EncoderBlock(nn.TransformerEncoderLayer):
    """PyTorch's own post-norm encoder layer (its fused paths off: training), with dropout."""

    def __init__(self, d: int, heads: int, p: float) -> None:
        super().__init__(d, heads, 4 * d, dropout=p, batch_first=True)


class Stack(nn.Module):
    """Token and position embeddings, the blocks, a final norm and the head: ids -> logits."""

    def __init__(self, block: type, layers: int = 4, d: int = 64, heads: int = 4, vocab: int = 128,
                 seq: int = 32, p: float = 0.1) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(block(d, heads, p) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def loss_of(model, ids, targets):
    logits = model(ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def checkpointing_budget(model, blocks, ids, targets) -> int:
    """The saved bytes per-block checkpointing holds at its peak, counted as the pager counts them
    (tensors of MIN_BYTES and more, parameters aside, a tensor saved twice once): what is saved
    outside the blocks, plus every block's input, plus the most one block saves when rebuilt."""
    seen: set = set()
    current = [None]
    inside = {i: 0 for i in range(len(blocks))}
    inputs, outside = {}, 0

    def pack(t):
        nonlocal outside
        base = t._base if t._base is not None else t
        n = t.numel() * t.element_size()
        if not (base.is_leaf and base.requires_grad) and n >= MIN_BYTES and (id(t), t._version) not in seen:
            seen.add((id(t), t._version))
            if current[0] is None:
                outside += n
            elif t is not inputs.get(current[0], (None,))[0]:
                inside[current[0]] += n
        return t

    def enter(i):
        def hook(mod, args):
            current[0] = i
            inputs[i] = (args[0], args[0].numel() * args[0].element_size())
        return hook

    handles = [b.register_forward_pre_hook(enter(i)) for i, b in enumerate(blocks)]
    handles += [b.register_forward_hook(lambda *a: current.__setitem__(0, None)) for b in blocks]
    try:
        with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_of(model, ids, targets)
    finally:
        for h in handles:
            h.remove()
    return outside + sum(n for _, n in inputs.values()) + max(inside.values())


def train(model, ids, targets, ctx, steps, autocast=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(100 + i)  # the same dropout masks with and without the pager
        cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
        with ctx, cast:
            loss = loss_of(model, ids, targets)
        loss.backward()
        out.append((loss.detach().clone(), [p.grad.clone() for p in model.parameters()]))
        opt.step()
    return out


def check_against_checkpointing(make_model, ids, targets, steps: int = 4, autocast: bool = False) -> dict:
    """Trains a fresh model from ``make_model()`` (which returns (model, blocks)) without the
    pager and with it at per-block checkpointing's memory, the link priced out; asserts the
    issue's targets and returns what was measured."""
    model, blocks = make_model()
    reference = train(model, ids, targets, torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), steps,
                      autocast)
    model, blocks = make_model()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        budget = checkpointing_budget(model, blocks, ids, targets)
    with AddressSpace(backend="host", capacity=256 * MiB, host_capacity=256 * MiB, page_size="64KiB",
                      host_granularity="64KiB") as space:
        pager = paged_activations(space, budget=budget, cost_model=NO_LINK)
        got = train(model, ids, targets, pager, steps, autocast)
        plan, st = pager.plan(), pager.stats()
        del pager
    for i, ((la, ga), (lb, gb)) in enumerate(zip(got, reference)):
        assert torch.equal(la, lb), f"loss of step {i} differs"
        assert all(torch.equal(g, h) for g, h in zip(ga, gb)), f"gradients of step {i} differ"
    s = plan.summary
    assert s.paged_bytes <= 0.05 * s.total_bytes, str(plan)
    assert st.step_bytes_paged <= 2 * 0.05 * s.total_bytes, str(plan)  # out and back
    again = st.step_recompute_flops  # the trace check runs no recompute: it adds none
    largest = max(r.nbytes for r in plan.rows)
    measured = {"budget": budget, "saved": s.total_bytes, "paged": s.paged_bytes,
                "moved_per_step": st.step_bytes_paged, "again_vs_forward": again / s.forward_flops,
                "peak": st.step_peak_resident_bytes, "fallbacks": st.recompute_fallbacks}
    assert st.recompute_fallbacks == 0 and st.fallback_iterations == 0, (measured, st)
    assert again <= 1.1 * s.forward_flops, (measured, str(plan))
    assert st.step_peak_resident_bytes <= budget + largest, (measured, str(plan))
    assert s.recomputed_bytes > 0 and st.step_checked_ops > 0, measured
    return measured


def _stack(block):
    def make():
        torch.manual_seed(0)
        m = Stack(block)
        return m, list(m.blocks)
    return make


@pytest.mark.parametrize("block,autocast", [(GPTBlock, False), (LlamaBlock, False), (EncoderBlock, False),
                                            (GPTBlock, True)], ids=["gpt", "llama", "post_norm_encoder", "gpt_bf16"])
def test_a_gpt_style_stack_at_checkpointings_memory_recomputes_exactly_and_pages_almost_nothing(block, autocast):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(128, (4, 32), generator=g)
    targets = torch.randint(128, (4, 32), generator=g)
    m = check_against_checkpointing(_stack(block), ids, targets, autocast=autocast)
    assert m["budget"] < m["saved"] / 2  # checkpointing's memory is well below what the stack saves
    print(f"{block.__name__}{' bf16' if autocast else ''}: {m}")  # docs/activation-plan.md quotes these (-s)


def test_the_checkpointing_budget_counts_inputs_and_one_block():
    torch.manual_seed(0)
    model = Stack(GPTBlock, layers=3, p=0.0)
    ids = torch.randint(128, (2, 32))
    b = checkpointing_budget(model, list(model.blocks), ids, ids)
    one_input = 2 * 32 * 64 * 4
    assert 3 * one_input < b < 3 * one_input + 3 * MiB and math.isfinite(b)
