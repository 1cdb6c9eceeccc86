"""The activation planner on plain numbers: keep when it fits, recompute what is cheaper than
moving (largest first), page the oldest rest; the budget bounds what is kept."""

from __future__ import annotations

from vtalloc.allocator.activation_plan import H100, Candidate, plan_activations

MiB = 1 << 20


def test_everything_fits_everything_kept():
    p = plan_activations([Candidate(i, MiB, "relu", recomputable=True, flops=1, touched=2 * MiB) for i in range(4)],
                         budget=4 * MiB)
    assert [r.decision for r in p.rows] == ["keep"] * 4 and p.summary.modelled_s == 0


def test_recompute_cheap_then_page_oldest_and_kept_within_budget():
    cands = [Candidate(0, 4 * MiB, "convolution"), Candidate(1, 4 * MiB, "gelu", recomputable=True, flops=MiB,
                                                            touched=8 * MiB, sources=(0,)),
             Candidate(2, 4 * MiB, "addmm"), Candidate(3, 4 * MiB, "addmm")]
    p = plan_activations(cands, budget=5 * MiB)
    assert [r.decision for r in p.rows] == ["page", "recompute", "page", "keep"]
    s = p.summary
    assert s.kept_bytes <= 5 * MiB and s.recomputed_bytes == 4 * MiB and s.paged_bytes == 8 * MiB
    assert abs(s.transfer_s - 2 * H100.move_s(4 * MiB)) < 1e-12
    assert "recompute" in str(p) and "prediction" in str(p)


def test_flops_cap_and_off():
    cands = [Candidate(0, 4 * MiB, "x"), Candidate(1, 4 * MiB, "gelu", recomputable=True, flops=10**6, touched=8 * MiB)]
    assert plan_activations(cands, MiB, max_recompute_flops=10**5).rows[1].decision == "page"
    assert plan_activations(cands, MiB, allow_recompute=False).rows[1].decision == "page"
    assert plan_activations(cands, MiB).rows[1].decision == "recompute"


def test_shared_and_no_room_rows():
    cands = [Candidate(0, 4 * MiB, "relu"), Candidate(1, 0, "", shared_with=0), Candidate(2, 0, "no room")]
    p = plan_activations(cands, budget=8 * MiB)
    assert [r.decision for r in p.rows] == ["keep", "shared", "page"]


def test_chains_are_bounded():
    cands = [Candidate(0, MiB, "x")] + [Candidate(i, MiB, "gelu", recomputable=True, flops=1, touched=2 * MiB,
                                                  sources=(i - 1,)) for i in range(1, 10)]
    p = plan_activations(cands, budget=MiB)
    from vtalloc.allocator.activation_plan import MAX_CHAIN

    run = best = 0
    for r in p.rows:
        run = run + 1 if r.decision == "recompute" else 0
        best = max(best, run)
    assert 0 < best <= MAX_CHAIN


def test_a_tensor_saved_twice_counts_its_recompute_flops_per_pack():
    # Each unpack of a shared record may recompute it (autograd drops the first value before
    # the second unpack): the cap and the summary count it once per pack.
    cands = [Candidate(0, 4 * MiB, "x"), Candidate(1, 4 * MiB, "sigmoid", recomputable=True, flops=10**5,
                                                   touched=8 * MiB, sources=(0,)),
             Candidate(2, 0, "", shared_with=1)]
    assert plan_activations(cands, MiB).summary.recompute_flops == 2 * 10**5
    assert plan_activations(cands, MiB, max_recompute_flops=15 * 10**4).rows[1].decision != "recompute"
    assert plan_activations(cands, MiB, max_recompute_flops=2 * 10**5).rows[1].decision == "recompute"


def test_raising_the_cap_does_not_recompute_fewer_bytes():
    from vtalloc.allocator.activation_plan import MAX_CHAIN

    # A matmul (cheap in modelled time, dear in FLOPs) under a chain of elementwise operations:
    # taken first, it would spend the chain bound and leave the larger elementwise tensors to the
    # link. FLOPs per byte order them: the cap can only add recomputes.
    cands = [Candidate(0, 4 * MiB, "x"),
             Candidate(1, MiB, "mm", recomputable=True, flops=10**9, touched=MiB, sources=(0,))]
    # memory-bound: more modelled time per byte than the matmul, far fewer FLOPs
    cands += [Candidate(i, 4 * MiB, "gelu", recomputable=True, flops=1000, touched=80 * MiB, sources=(i - 1,))
              for i in range(2, 2 + MAX_CHAIN)]  # a chain as deep as allowed
    low = plan_activations(cands, MiB, max_recompute_flops=10**5, verify_at_pack=True)
    high = plan_activations(cands, MiB, max_recompute_flops=None, verify_at_pack=True)
    assert low.summary.recomputed_bytes > 0
    assert high.summary.recomputed_bytes >= low.summary.recomputed_bytes, (str(low), str(high))
    # and no recompute nests deeper than the bound, counted through every recomputed source
    for p in (low, high):
        rec = {r.index for r in p.rows if r.decision == "recompute"}

        def depth(i, rec=rec):
            return 1 + max((depth(s, rec) for s in cands[i].sources if s in rec), default=0)

        assert all(depth(i) <= MAX_CHAIN for i in rec), str(p)


def test_a_recompute_is_planned_only_if_all_its_runs_cost_less_than_the_move():
    # Two operations (10 us of launches) against moving 64 KiB out and back (12.4 us): cheaper
    # run once, dearer run twice (at pack to verify, and at unpack).
    n = 64 * 1024
    cands = [Candidate(0, n, "x"), Candidate(1, n, "gelu", recomputable=True, flops=n, touched=2 * n, ops=2,
                                             sources=(0,))]
    assert H100.recompute_s(n, 2 * n, 2) < H100.move_s(n) < 2 * H100.recompute_s(n, 2 * n, 2)
    assert plan_activations(cands, 1024).rows[1].decision == "recompute"
    verified = plan_activations(cands, 1024, verify_at_pack=True)
    assert verified.rows[1].decision == "page", str(verified)
    off = plan_activations(cands, 1024, allow_recompute=False)
    assert verified.summary.modelled_s <= off.summary.modelled_s
