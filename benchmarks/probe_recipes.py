"""Which saved tensors paged_activations can recompute, and why the others cannot.

Owns: the recipe-coverage probe: for one model of bench_offload_training.py (the same build,
data and ``--budget-fraction`` budget), the recorded iteration's saved tensors in pack order,
each with the operation that made it, its bytes, whether a recipe was built and verified
bit-exact (or why not), the recipe's FLOPs and the plan's decision at the default cap and at
``--max-recompute-fraction``; summed by reason, and the bound that matters for the recompute
cap: the saved bytes whose recipe costs at most the cap (alone), against the bytes the budget
forces out.
Invariants: the model, data, budget and space are bench_offload_training.py's (lib/training_models.py's functions
are used, not copied); the rows are the pager's own (``pager.plan()`` and its candidates), not
a second analysis; JSON with provenance to ``--out``.

    python benchmarks/probe_recipes.py --model tiny_transformer --out F.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import training_models as training  # noqa: E402
from lib.provenance import git_info, machine_info  # noqa: E402

MiB = 1 << 20


def probe(model: str, budget_fraction: float, batch: int, fractions: list[float], autocast: bool) -> dict[str, Any]:
    import contextlib

    import torch

    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.activation_plan import plan_activations
    from vtalloc.allocator.torch import paged_activations

    torch.set_num_threads(1)
    net, x, y, loss_fn = training.build(torch, model, batch, "cpu")
    net.train()
    fwd = training.measure_forward(torch, net, x)
    budget = max(int(fwd["saved_bytes"] * budget_fraction), 1)
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    with AddressSpace(backend="host", capacity=2 * fwd["saved_bytes"] + 16 * MiB, host_capacity="1GiB",
                      page_size="256KiB", host_granularity="256KiB") as space:
        pager = paged_activations(space, budget=budget)
        with pager, cast():
            loss = loss_fn(net(x), y)
        cands = list(pager._rec_cands)
        forward = pager._replay.forward_flops
        loss.backward()
        plans = {f: plan_activations(cands, budget, pager.cost_model, max_recompute_flops=int(forward * f),
                                     unpack_order=pager._rec_unpacks, forward=pager._replay.forward)
                 for f in fractions}
        del pager, loss
    rows = []
    for c in cands:
        rows.append({"index": c.index, "op": c.op, "bytes": c.nbytes, "shared_with": c.shared_with,
                     "recipe": "verified" if c.recomputable else ("shared" if c.shared_with is not None else c.why),
                     "recipe_flops": c.flops, "sources": list(c.sources),
                     **{f"decision_at_{f:g}": p.rows[c.index].decision for f, p in plans.items()}})
    by_reason: dict[str, int] = collections.Counter()
    for r in rows:
        by_reason[r["recipe"]] += r["bytes"]
    total = sum(r["bytes"] for r in rows)
    summary = {"saved_bytes": total, "budget_bytes": budget, "excess_bytes": max(total - budget, 0),
               "forward_flops_flop_counter": forward, "bytes_by_recipe_status": dict(by_reason)}
    for f, p in plans.items():
        cap = int(forward * f)
        # An upper bound on what recompute can take off the link under the cap: the tensors whose
        # recipe alone fits (each recomputed tensor runs once a step, with its segment).
        summary[f"at_{f:g}"] = {
            "cap_flops": cap,
            "bytes_recomputable_alone_within_cap": sum(c.nbytes for c in cands if c.recomputable and c.flops <= cap),
            "plan_recomputed_bytes": p.summary.recomputed_bytes, "plan_paged_bytes": p.summary.paged_bytes,
            "plan_recompute_flops": p.summary.recompute_flops}
    return {"model": model, "batch": batch, "autocast_bf16": autocast, "budget_fraction": budget_fraction,
            "forward": fwd, "summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny_transformer", help="cnn, tiny_transformer, gpt2, llama")
    ap.add_argument("--budget-fraction", type=float, default=0.25)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-recompute-fraction", type=float, default=1.0, help="a second cap to plan at (default 0.05 too)")
    ap.add_argument("--autocast", action="store_true", help="CPU bf16 autocast around the forward")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    res = probe(a.model, a.budget_fraction, a.batch, sorted({0.05, a.max_recompute_fraction}), a.autocast)
    res["provenance"] = {"command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
                         "machine": machine_info(), "git": git_info()}
    fr = [k for k in res["rows"][0] if k.startswith("decision_at_")] if res["rows"] else []
    print(f"{'#':>4} {'KiB':>8} {'op':<44} {'recipe FLOPs':>13} " + " ".join(f"{k[12:]:>9}" for k in fr) + "  recipe")
    for r in res["rows"]:
        print(f"{r['index']:>4} {r['bytes'] / 1024:>8.1f} {r['op'][:44]:<44} {r['recipe_flops']:>13,} "
              + " ".join(f"{r[k]:>9}" for k in fr) + f"  {r['recipe']}")
    print(json.dumps(res["summary"], indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
