"""The activation planner on plain numbers: keep when it fits, segments rebuilt once from what
stays, the budget held at every moment of the step, paging priced by what the link cannot hide,
the FLOPs cap, and the time a 24-layer iteration takes to plan."""

from __future__ import annotations

import time

from hypothesis import given, settings, strategies as st

from vtalloc.allocator.activation_costs import H100, CostModel, Forward, host_added_s, paging_stall_s
from vtalloc.allocator.activation_plan import Candidate, plan_activations

MiB = 1 << 20
# The link priced out: paging anything costs more than recomputing everything.
NO_LINK = CostModel(link_bytes_per_s=1e3, peak_flops=H100.peak_flops, mem_bytes_per_s=H100.mem_bytes_per_s,
                    launch_s=H100.launch_s, name="no link")


def chain_blocks(layers: int, block: int = 4, nbytes: int = MiB, input_recipe: bool = False):
    """A stack of ``layers`` blocks: each block's first tensor is its input (the previous block's
    output, rebuilt from the block before by an add), then ``block - 1`` tensors each made from
    the one before (a matmul, then elementwise). Pack order; backward unpacks in reverse."""
    cands, at = [], 0.0
    for layer in range(layers):
        for k in range(block):
            i = len(cands)
            at += 1e-5
            if i == 0:
                cands.append(Candidate(0, nbytes, "input", recomputable=input_recipe, at_s=at))
            elif k == 0:  # the block's input: the residual add of the block before
                cands.append(Candidate(i, nbytes, "add", recomputable=True, flops=nbytes, touched=3 * nbytes,
                                       sources=(i - block, i - 1), at_s=at))
            elif k == 1:
                cands.append(Candidate(i, nbytes, "addmm", recomputable=True, flops=10**9, touched=2 * nbytes,
                                       sources=(i - 1,), at_s=at))
            else:
                cands.append(Candidate(i, nbytes, "gelu", recomputable=True, flops=nbytes, touched=2 * nbytes,
                                       sources=(i - 1,), at_s=at))
    return cands, Forward(ops=3 * len(cands), clock_s=at, device_s=at, host_s=3 * len(cands) * 5e-6)


def test_everything_fits_everything_kept():
    p = plan_activations([Candidate(i, MiB, "relu", recomputable=True, flops=1, touched=2 * MiB) for i in range(4)],
                         budget=4 * MiB)
    assert [r.decision for r in p.rows] == ["keep"] * 4 and p.summary.modelled_s == 0


def test_with_the_link_priced_out_blocks_are_rebuilt_from_their_kept_inputs():
    # Checkpointing's memory: every block input kept, and room for one block rebuilt at once.
    layers, block = 6, 4
    cands, fwd = chain_blocks(layers, block)
    budget = (layers + block - 1) * MiB
    p = plan_activations(cands, budget, NO_LINK, forward=fwd)
    s = p.summary
    assert s.paged_bytes == 0, str(p)
    assert s.peak_bytes <= budget
    # each recomputed tensor's own operations run once a step: at most one forward's FLOPs, and
    # no more time than per-block checkpointing (every block but its input rebuilt) would take
    assert s.recompute_flops <= sum(c.flops for c in cands)
    per_block = sum(NO_LINK.run_s(c.flops, c.touched, c.ops) for c in cands if c.index % block)
    assert s.recompute_s <= per_block, str(p)
    assert s.segments >= 2 and s.largest_segment_bytes <= budget - MiB, str(p)


def test_below_checkpointings_memory_the_budget_holds_and_little_is_paged():
    layers, block = 4, 6
    cands, fwd = chain_blocks(layers, block)
    budget = (layers + 2) * MiB  # less than a block besides the inputs
    p = plan_activations(cands, budget, NO_LINK, forward=fwd)
    alone = plan_activations(cands, budget, NO_LINK, forward=fwd, allow_recompute=False)
    assert p.summary.peak_bytes <= budget
    assert p.summary.paged_bytes * 4 <= alone.summary.paged_bytes, (str(p), str(alone))


def test_a_tensor_without_recipe_is_kept_or_paged_never_recomputed():
    cands, fwd = chain_blocks(3)
    cands[5] = Candidate(5, MiB, "opaque", at_s=cands[5].at_s)
    cands[6] = Candidate(6, MiB, "gelu", recomputable=True, flops=MiB, touched=2 * MiB, sources=(5,), at_s=cands[6].at_s)
    p = plan_activations(cands, 4 * MiB, NO_LINK, forward=fwd)
    assert p.rows[0].decision in ("keep", "page") and p.rows[5].decision in ("keep", "page")


def test_shared_and_no_room_rows():
    cands = [Candidate(0, 4 * MiB, "relu"), Candidate(1, 0, "", shared_with=0), Candidate(2, 0, "no room")]
    p = plan_activations(cands, budget=8 * MiB)
    assert [r.decision for r in p.rows] == ["keep", "shared", "page"]


def test_the_flops_cap_holds():
    cands, fwd = chain_blocks(4)
    full = plan_activations(cands, 5 * MiB, NO_LINK, forward=fwd)
    cap = full.summary.recompute_flops // 2
    capped = plan_activations(cands, 5 * MiB, NO_LINK, forward=fwd, max_recompute_flops=cap)
    assert 0 < capped.summary.recompute_flops <= cap < full.summary.recompute_flops
    assert plan_activations(cands, 5 * MiB, NO_LINK, forward=fwd, allow_recompute=False).summary.recomputed_bytes == 0


def test_paging_costs_only_what_the_link_cannot_hide():
    fwd = Forward(ops=100, clock_s=10e-3, device_s=10e-3, host_s=0.5e-3)
    small = [(i * 1e-3, 10 * MiB, 20e-3 - 2 * i * 1e-3) for i in range(5)]  # 50 MiB in a 10 ms forward
    assert paging_stall_s(H100, fwd, small, slack=64 * MiB) == 0.0
    big = [(i * 1e-3, 200 * MiB, 20e-3 - 2 * i * 1e-3) for i in range(5)]  # 1 GB: ~19 ms each way
    assert paging_stall_s(H100, fwd, big, slack=64 * MiB) > 0.0
    assert paging_stall_s(H100, Forward(), small, 64 * MiB) > 0.0  # nothing recorded: nothing hides
    # host work hides behind a device-bound forward, and counts in full once the host is the slower
    assert host_added_s(fwd, H100, 1e-3, 1e-3) == 0.0
    assert host_added_s(Forward(ops=100, clock_s=1e-3, device_s=0.2e-3, host_s=0.5e-3), H100, 1e-3, 0) == 1e-3


def test_where_the_link_hides_copies_the_plan_pages_instead_of_recomputing():
    cands, _ = chain_blocks(4, nbytes=MiB)
    slow_compute = CostModel(link_bytes_per_s=H100.link_bytes_per_s, peak_flops=1e12, mem_bytes_per_s=1e10,
                             launch_s=5e-6, name="slow compute")
    long_fwd = Forward(ops=48, clock_s=50e-3, device_s=50e-3, host_s=48 * 5e-6)
    cands = [Candidate(c.index, c.nbytes, c.op, c.recomputable, c.flops, c.touched, c.ops, c.sources,
                       at_s=c.index * 3e-3) for c in cands]
    p = plan_activations(cands, 4 * MiB, slow_compute, forward=long_fwd)
    assert p.summary.paged_bytes > p.summary.recomputed_bytes and p.summary.transfer_s == 0, str(p)


def _random_plan_case(draw):
    n = draw(st.integers(2, 40))
    cands = []
    for i in range(n):
        nbytes = draw(st.sampled_from([0, 4096, MiB, 3 * MiB]))
        srcs = tuple(sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3))))) if i else ()
        shared = draw(st.booleans()) and i > 0 and nbytes == 0
        cands.append(Candidate(i, nbytes, "x", recomputable=draw(st.booleans()), flops=draw(st.integers(0, 10**9)),
                               touched=nbytes, sources=srcs, shared_with=i - 1 if shared else None, at_s=i * 1e-5))
    order = draw(st.permutations([c.index for c in cands if c.nbytes and c.shared_with is None]))
    return cands, order


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_plan_keeps_its_invariants(data):
    cands, order = _random_plan_case(data.draw)
    budget = data.draw(st.integers(1, 12)) * MiB
    model = data.draw(st.sampled_from([H100, NO_LINK]))
    p = plan_activations(cands, budget, model, unpack_order=order, forward=Forward(ops=10, clock_s=1e-3, device_s=1e-3))
    for c, r in zip(cands, p.rows):
        assert r.decision != "recompute" or c.recomputable
        assert (r.decision == "shared") == (c.shared_with is not None)
    s = p.summary
    assert s.kept_bytes + s.paged_bytes + s.recomputed_bytes == s.total_bytes
    assert s.modelled_s >= 0
    if s.total_bytes <= budget:
        assert s.modelled_s == 0 and s.kept_bytes == s.total_bytes
    else:  # the chosen plan holds the budget, or it is paging alone (the newest that fit kept)
        assert s.peak_bytes <= budget or s.recomputed_bytes == 0, str(p)


def test_a_24_layer_iteration_is_planned_in_well_under_a_second():
    cands, fwd = chain_blocks(24, block=30, nbytes=MiB)  # 720 saved tensors, a GPT-2 block's count each
    t0 = time.process_time()
    p = plan_activations(cands, 60 * MiB, NO_LINK, forward=fwd)
    spent = time.process_time() - t0
    assert spent < 1.0 and p.summary.plan_s < 1.0, spent
    assert p.summary.peak_bytes <= 60 * MiB and p.summary.paged_bytes == 0, str(p.summary)
