"""predict_gpu_plan: the H100 prediction for the GPU benchmark's models at 4x their native batch under 16 GiB.

Owns: a prediction, not a measurement (there is no GPU here): a model of bench_offload_training.py
(``transformer``: 8 x TransformerEncoderLayer(2048, 16, 8192), seq 1024; ``resnet50``: its
ResNet-50, 224x224, channels_last), bf16 autocast (the CPU's here, the GPU run's there), recorded
on CPU and planned by ``paged_activations``' own planner as 4x the native batch would be, with
per-block checkpointing's recompute (and, for ``checkpoint_offload``, what it moves) counted the
same way; then predicted samples/s beside the H100's measured ones.

The batch from batches 2 and 3: the iteration is recorded at both (at batch 1 some operations
take other paths: a linear over a 3-d input of batch 1 runs ``addmm`` on a view, not ``mm``); every saved tensor's bytes,
FLOPs and bytes touched, and every operation's, are a + b x batch (the bf16 weight copies
autocast saves do not grow with the batch; activations do), so the two recordings give them at
the target batch, priced on the H100 cost model as they are (the forward's clock rebuilt
operation by operation). The budget: 16 GiB less the model's own memory, counted, not measured:
fp32 parameters and gradients, the bf16 weight copies autocast keeps, the batch, and twice the
largest saved tensor (as activation_budget measures it on a GPU). The base step: the step
measured on the H100 at the native batch (2026-11-26, BENCHMARKS.md) times 4; and, beside it, the
cost model's own (3 x the modelled forward).
Invariants: every figure written is computed here from the recorded iterations and the constants
named; the JSON says which are predictions.

    python benchmarks/predict_gpu_plan.py --model transformer --out benchmarks/results/predicted_transformer_4x-h100-DATE.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import training_models as training  # noqa: E402
from lib.offload_peers import RecomputeCount, checkpoint_blocks  # noqa: E402
from lib.provenance import git_info, machine_info  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
CAP = 16 * GiB
MULTIPLE = 4
# Measured on the H100, 2026-11-26 (BENCHMARKS.md, "Offload training at 4x the native batch, default
# settings"): the native batch's step, and samples/s at 4x where the run finished.
MEASURED = {
    "transformer": {"native_batch": 16, "native_step_s": 0.0992, "checkpoint_samples_per_s": 123.9,
                    "vtalloc_samples_per_s": 46.9},
    "resnet50": {"native_batch": 256, "native_step_s": 0.0647, "checkpoint_samples_per_s": None,  # not finished
                 "vtalloc_samples_per_s": 538.0},
}


def record(torch: Any, model: str, batch: int) -> dict[str, Any]:
    """One recorded iteration at ``batch``: the planner's rows, the unpack order, every forward
    operation's cost, what checkpointing runs again and what it keeps outside its blocks."""
    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.activation_costs import H100
    from vtalloc.allocator.torch import paged_activations

    net, x, y, loss_fn = training.build(torch, model, batch, "cpu")
    cast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731 - as the GPU run's bf16 autocast
    with cast():
        fwd = training.measure_forward(torch, net, x)
    with AddressSpace(backend="host", capacity=2 * fwd["saved_bytes"] + 64 * MiB, host_capacity=8 * GiB,
                      page_size="2MiB") as space:
        pager = paged_activations(space, budget=fwd["saved_bytes"], cost_model=H100)
        with pager, cast():
            loss = loss_fn(net(x), y)
        loss.backward()
        got = {"cands": list(pager._rec_cands), "order": list(pager._rec_unpacks), "costs": list(pager._replay.costs),
               "params": sum(p.numel() for p in net.parameters()),
               "batch_bytes": x.numel() * x.element_size() + y.numel() * y.element_size()}
        del pager, loss
    ck_net = checkpoint_blocks(torch, model, net)
    with cast():
        kept = training.measure_forward(torch, ck_net, x)["saved_bytes"]  # what checkpointing keeps (save_on_cpu moves)
    count = RecomputeCount(H100)
    with cast():
        loss = loss_fn(ck_net(x), y)
    with count.mode:
        loss.backward()
    got["recompute"], got["checkpoint_kept"] = count.costs, kept
    return got


FIT = (2, 3)  # the batches recorded


def at(a: int, b: int, batch: int) -> int:
    """A quantity measured at batches FIT (a, b), at ``batch``."""
    return max(a + (b - a) * (batch - FIT[0]) // (FIT[1] - FIT[0]), 0)


def predict(model: str) -> dict[str, Any]:
    import torch

    from vtalloc.allocator.activation_costs import H100, Forward
    from vtalloc.allocator.activation_plan import plan_activations

    torch.set_num_threads(2)
    measured = MEASURED[model]
    SCALE = MULTIPLE * measured["native_batch"]  # noqa: N806 - the target batch
    one, two = record(torch, model, FIT[0]), record(torch, model, FIT[1])
    if len(one["cands"]) != len(two["cands"]) or len(one["costs"]) != len(two["costs"]):
        raise SystemExit(f"batches {FIT} saved different tensors: no linear fit")
    ops = [(at(f1, f2, SCALE), at(t1, t2, SCALE)) for (f1, t1), (f2, t2) in zip(one["costs"], two["costs"])]
    clock, dev, times = 0.0, 0.0, [0.0]
    for f, t in ops:
        d = H100.device_s(f, t)
        dev += d
        clock += max(d, H100.launch_s)
        times.append(clock)
    cands = [dataclasses.replace(c, nbytes=at(c.nbytes, c2.nbytes, SCALE), flops=at(c.flops, c2.flops, SCALE),
                                 touched=at(c.touched, c2.touched, SCALE), at_s=times[c.at_op])
             for c, c2 in zip(one["cands"], two["cands"])]
    forward = Forward(len(ops), clock, dev, len(ops) * H100.launch_s, sum(f for f, _ in ops))
    largest = max(c.nbytes for c in cands)
    params = one["params"]
    own = {"parameters_fp32": 4 * params, "gradients_fp32": 4 * params, "autocast_bf16_weights": 2 * params,
           "batch": at(one["batch_bytes"], two["batch_bytes"], SCALE), "twice_the_largest_saved_tensor": 2 * largest}
    budget = CAP - sum(own.values())
    plan = plan_activations(cands, budget, H100, unpack_order=one["order"], forward=forward)
    ck = sum(H100.run_s(at(f1, f2, SCALE), at(t1, t2, SCALE)) for (f1, t1), (f2, t2) in zip(one["recompute"],
                                                                                          two["recompute"]))
    kept = at(one["checkpoint_kept"], two["checkpoint_kept"], SCALE)
    moved = 2 * kept / H100.link_bytes_per_s  # save_on_cpu copies on the compute stream: nothing hidden
    s = plan.summary
    base_measured = MULTIPLE * measured["native_step_s"]
    base_model = (1 + H100.backward_factor) * forward.clock_s
    step = {"vtalloc": base_measured + s.modelled_s, "checkpoint": base_measured + ck,
            "checkpoint_offload": base_measured + ck + moved}
    return {
        "prediction": True, "device": f"H100 (cost model activation_costs.H100; batch {SCALE} fitted from batches {FIT})",
        "model": f"{model} (bench_offload_training.py), bf16 autocast (CPU's here)",
        "batch": SCALE, "cap_bytes": CAP, "own_bytes": own, "budget_bytes": budget, "saved_bytes": s.total_bytes,
        "checkpoint_kept_bytes": kept,
        "plan": {"kept_bytes": s.kept_bytes, "paged_bytes": s.paged_bytes, "recomputed_bytes": s.recomputed_bytes,
                 "segments": s.segments, "recompute_flops": s.recompute_flops, "forward_flops": s.forward_flops,
                 "link_stalls_s": s.transfer_s, "recompute_s": s.recompute_s, "host_s": s.check_s,
                 "added_s": s.modelled_s, "plan_cpu_s": s.plan_s, "peak_bytes": s.peak_bytes},
        "checkpoint": {"recomputed_ops": len(one["recompute"]), "added_s": ck,
                       "fits_the_cap": kept + sum(own.values()) < CAP},
        "checkpoint_offload": {"moved_bytes": 2 * kept, "added_s": ck + moved},
        "base_step_s": {"measured_uncapped_x4": base_measured, "cost_model": base_model},
        "predicted_step_s": step,
        "predicted_samples_per_s": {k: SCALE / v for k, v in step.items()},
        "predicted_vs_checkpoint": step["checkpoint"] / step["vtalloc"],
        "predicted_vs_uncapped": base_measured / step["vtalloc"],
        "measured": {**measured, "source": "BENCHMARKS.md, GPU figures (H100, 2026-11-26)"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="transformer", choices=sorted(MEASURED))
    ap.add_argument("--out", default="benchmarks/results/predicted_{model}_4x-h100-{date}.json")
    a = ap.parse_args(argv)
    date = _dt.date.today().isoformat()
    res = predict(a.model)
    res["provenance"] = {"date": date, "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
                         "machine": machine_info(), "git": git_info()}
    out = Path(a.out.format(date=date, model=a.model))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    p = res["plan"]
    print(f"PREDICTION (H100 cost model, not measured): {a.model} batch {res['batch']}, budget {res['budget_bytes'] / GiB:.2f} GiB of "
          f"{res['saved_bytes'] / GiB:.1f} GiB saved: kept {p['kept_bytes'] / GiB:.2f}, paged {p['paged_bytes'] / GiB:.2f}, "
          f"recomputed {p['recomputed_bytes'] / GiB:.2f} GiB in {p['segments']} segments; adds {p['added_s'] * 1e3:.1f} ms "
          f"(checkpointing {res['checkpoint']['added_s'] * 1e3:.1f} ms); samples/s vtalloc "
          f"{res['predicted_samples_per_s']['vtalloc']:.1f}, checkpoint {res['predicted_samples_per_s']['checkpoint']:.1f}, "
          f"checkpoint_offload {res['predicted_samples_per_s']['checkpoint_offload']:.1f}: "
          f"{res['predicted_vs_checkpoint']:.2f}x checkpointing, {res['predicted_vs_uncapped']:.0%} of uncapped; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
