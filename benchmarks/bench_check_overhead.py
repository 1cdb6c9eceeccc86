"""What the plan's machinery costs on CPU: the trace check per operation, the recorded iteration, planning.

Owns: three measurements, written to one JSON with provenance:

* **check**: the host time the trace check (``activation_check.TraceCheck``) adds to each aten
  operation of a forward: the forward of each model at batch 1 (``--forward-batch``: its
  operations cost their host time, hardly any compute) timed plain and under the check built
  from its own plan (the link priced out, so the plan recomputes and the check observes the
  recipes' positions), interleaved over ``--repeats``; per operation = (checked - plain) /
  operations, of the fastest forward of each kind (the least disturbed by other work on the
  machine), and as a multiple of the plain forward's time per operation (what transfers to
  another host: ``CHECK_RATIO`` in activation_costs), with an empty dispatch mode's cost beside
  it (what any mode costs). The recorder's per-operation cost alone the same way;
* **recorded iteration**: whole training steps under ``paged_activations`` (the first records:
  the recorder, each recipe compiled, run and compared, the plan made at the next entry) against
  the later ones and against steps with no pager;
* **planning**: ``plan_activations`` on the recorded iteration of a 24-layer GPT-2 (transformers,
  random weights, n_embd 256, seq 64, batch 8), CPU time (``time.process_time``), H100 model at
  25% of the saved bytes and with the link priced out.

Invariants: one thread; every figure is measured here and written with the command, machine and
commit; times on a loaded machine are indicative (the load average is recorded).

    python benchmarks/bench_check_overhead.py --out benchmarks/results/check_overhead-cpu-DATE.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import training_models as training  # noqa: E402
from lib.provenance import git_info, machine_info  # noqa: E402

MiB = 1 << 20


def _no_link() -> Any:
    from vtalloc.allocator.activation_costs import H100, CostModel

    return CostModel(link_bytes_per_s=1e3, peak_flops=H100.peak_flops, mem_bytes_per_s=H100.mem_bytes_per_s,
                     launch_s=H100.launch_s, name="h100, link priced out")


def _space(saved: int) -> Any:
    from vtalloc.allocator import AddressSpace

    return AddressSpace(backend="host", capacity=2 * saved + 16 * MiB, host_capacity="1GiB", page_size="256KiB",
                        host_granularity="256KiB")


def _steps(torch: Any, net: Any, x: Any, y: Any, loss_fn: Any, ctx: Any, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        net.zero_grad(set_to_none=True)
        with ctx():
            loss = loss_fn(net(x), y)
        loss.backward()
        times.append(time.perf_counter() - t0)
    return times


def model_costs(name: str, batch: int, repeats: int, steps: int, forward_batch: int, time_forward: bool) -> dict[str, Any]:
    import contextlib

    import torch

    from vtalloc.allocator.torch import paged_activations
    from vtalloc.allocator.torch.activation_check import TraceCheck
    from vtalloc.allocator.torch.activation_recorder import Recorder

    torch.set_num_threads(1)
    net, x, y, loss_fn = training.build(torch, name, batch, "cpu")
    fwd = training.measure_forward(torch, net, x)
    out: dict[str, Any] = {"model": name, "batch": batch, "saved_bytes": fwd["saved_bytes"]}
    with _space(fwd["saved_bytes"]) as space:
        pager = paged_activations(space, budget=max(fwd["saved_bytes"] // 4, 1), cost_model=_no_link())
        times = _steps(torch, net, x, y, loss_fn, lambda: pager, steps)
        plain = _steps(torch, net, x, y, loss_fn, contextlib.nullcontext, steps)
        spec, summary = pager._replay.spec, pager.plan().summary
        out["steps"] = {"recorded_s": times[0], "later_median_s": statistics.median(times[2:]),
                        "no_pager_median_s": statistics.median(plain[1:]),
                        "plan": {"recomputed_bytes": summary.recomputed_bytes, "paged_bytes": summary.paged_bytes,
                                 "segments": summary.segments, "plan_s": summary.plan_s}}
        del pager
    if spec is None or not time_forward:
        out["check"] = "not timed" if spec is not None else "the plan recomputes nothing: no check to time"
        return out
    if forward_batch != batch:  # the same model at the forward's batch: its own plan and check
        net, x, y, loss_fn = training.build(torch, name, forward_batch, "cpu")
        fwd = training.measure_forward(torch, net, x)
        with _space(fwd["saved_bytes"]) as space:
            pager = paged_activations(space, budget=max(fwd["saved_bytes"] // 4, 1), cost_model=_no_link())
            _steps(torch, net, x, y, loss_fn, lambda: pager, 2)
            spec = pager._replay.spec
            del pager
        if spec is None:
            out["check"] = f"the plan at batch {forward_batch} recomputes nothing: no check to time"
            return out
    ops = len(spec.funcs)

    def forward(mode: Any) -> float:
        with torch.random.fork_rng(devices=[]):
            t0 = time.perf_counter()
            with (mode if mode is not None else contextlib.nullcontext()):
                loss_fn(net(x), y)
            return time.perf_counter() - t0

    from torch.utils._python_dispatch import TorchDispatchMode

    class Empty(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    rows: dict[str, list[float]] = {"plain": [], "empty_mode": [], "check": [], "recorder": []}
    for _ in range(repeats):  # interleaved: a change of load touches all alike
        rows["plain"].append(forward(None))
        rows["empty_mode"].append(forward(Empty()))
        rows["check"].append(forward(TraceCheck(spec)))
        rows["recorder"].append(forward(Recorder()))
    best = {k: min(v) for k, v in rows.items()}
    out["forward"] = {"batch": forward_batch, "operations": ops, "observed_positions": len(spec.positions),
                      "plain_per_op_s": best["plain"] / ops,
                      "check_vs_plain_op": (best["check"] - best["plain"]) / best["plain"],
                      **{f"{k}_min_s": v for k, v in best.items()},
                      **{f"{k}_median_s": statistics.median(v) for k, v in rows.items()},
                      **{f"{k}_per_op_s": (best[k] - best["plain"]) / ops for k in ("empty_mode", "check", "recorder")}}
    return out


def window_cost(repeats: int) -> dict[str, Any]:
    """What one window of the trace check costs a forward: the module whose call opens it and
    closes it (its two hooks, the check pushed and popped), against the same module called without
    hooks (its forward runs no operation: only the window's own work is timed)."""
    import weakref

    import torch

    from vtalloc.allocator.torch.activation_check import TraceCheck, TraceSpec
    from vtalloc.allocator.torch.activation_windows import POST, PRE, Windows

    plain_mod, mod, x = torch.nn.Identity(), torch.nn.Identity(), torch.zeros(1)
    windows = Windows([(1, 2)], [(1, weakref.ref(mod), PRE, 0), (2, weakref.ref(mod), POST, 0)], ops=3)
    check = TraceCheck(TraceSpec((), {}))
    n = 1000
    rows: dict[str, list[float]] = {"plain": [], "window": []}
    for _ in range(max(repeats // 10, 5)):
        t0 = time.perf_counter()
        for _ in range(n):
            plain_mod(x)
        rows["plain"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(n):
            windows.begin(check)  # an iteration: its first call of the module opens, then closes
            mod(x)
        rows["window"].append(time.perf_counter() - t0)
    windows.end()
    windows.remove()
    best = {k: min(v) / n for k, v in rows.items()}
    return {"per_window_s": best["window"] - best["plain"], **{f"{k}_s": v for k, v in best.items()},
            "note": "the hooked module called (pre hook: push, post hook: pop) less the same call without hooks, "
                    "fastest of the repeats; begin() is inside the loop (an iteration's bookkeeping)"}


def planning(repeats: int) -> dict[str, Any]:
    import torch
    import transformers

    from vtalloc.allocator.activation_costs import H100
    from vtalloc.allocator.activation_plan import plan_activations
    from vtalloc.allocator.torch import paged_activations

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=24, n_embd=256, n_head=4, n_positions=128, vocab_size=1000, use_cache=False)
    cfg._attn_implementation = "eager"
    net = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(1)
    ids, y = torch.randint(1000, (8, 64), generator=g), torch.randint(1000, (8, 64), generator=g)
    fwd = training.measure_forward(torch, lambda i: net(input_ids=i).logits, ids)
    budget = fwd["saved_bytes"] // 4
    with _space(fwd["saved_bytes"]) as space:
        pager = paged_activations(space, budget=budget)
        with pager:
            logits = net(input_ids=ids).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, 1000), y.reshape(-1)).backward()
        cands, order, forward = list(pager._rec_cands), list(pager._rec_unpacks), pager._replay.forward
        del pager, logits
    res: dict[str, Any] = {"model": "gpt2, 24 layers, n_embd 256, batch 8, seq 64", "saved_tensors": len(cands),
                           "saved_bytes": sum(c.nbytes for c in cands), "budget_bytes": budget}
    for label, model in (("h100", H100), ("h100_link_priced_out", _no_link())):
        cpu = []
        for _ in range(min(repeats, 5)):
            t0 = time.process_time()
            p = plan_activations(cands, budget, model, unpack_order=order, forward=forward)
            cpu.append(time.process_time() - t0)
        s = p.summary
        res[label] = {"cpu_s_median": statistics.median(cpu), "cpu_s_max": max(cpu), "paged_bytes": s.paged_bytes,
                      "recomputed_bytes": s.recomputed_bytes, "segments": s.segments, "modelled_s": s.modelled_s}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny_transformer,gpt2")
    ap.add_argument("--batch", type=int, default=8, help="the training steps' batch")
    ap.add_argument("--forward-batch", type=int, default=1, help="the timed forwards' batch")
    ap.add_argument("--repeats", type=int, default=200, help="forwards of each kind timed, interleaved")
    ap.add_argument("--forward-models", default="tiny_transformer",
                    help="models whose forward is timed with and without the check (small: host-bound)")
    ap.add_argument("--steps", type=int, default=6, help="training steps per pager run (the first records)")
    ap.add_argument("--out", default="benchmarks/results/check_overhead-cpu-{date}.json")
    a = ap.parse_args(argv)
    date = _dt.date.today().isoformat()
    record: dict[str, Any] = {"benchmark": "check_overhead", "provenance": {
        "date": date, "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "machine": machine_info(),
        "git": git_info()}, "models": [model_costs(m, a.batch, a.repeats, a.steps, a.forward_batch,
                                              m in a.forward_models.split(",")) for m in a.models.split(",")],
        "planning_24_layers": planning(a.repeats), "window": window_cost(a.repeats)}
    timed = [m["forward"] for m in record["models"] if "forward" in m]
    if timed:  # what WINDOW_RATIO is: a window's cost in plain operations of the timed forward
        record["window"]["window_vs_plain_op"] = record["window"]["per_window_s"] / timed[0]["plain_per_op_s"]
    out = Path(a.out.format(date=date))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    for m in record["models"]:
        f = m.get("forward", {})
        print(f"{m['model']}: check {f.get('check_per_op_s', 0) * 1e6:.2f} us/op, "
              f"{f.get('check_vs_plain_op', 0):.2f}x a plain operation's {f.get('plain_per_op_s', 0) * 1e6:.2f} us (an empty mode "
              f"{f.get('empty_mode_per_op_s', 0) * 1e6:.2f}), recorder "
              f"{f.get('recorder_per_op_s', 0) * 1e6:.2f} us/op over {f.get('operations')} ops; steps: recorded "
              f"{m['steps']['recorded_s'] * 1e3:.1f} ms, later {m['steps']['later_median_s'] * 1e3:.1f} ms, "
              f"no pager {m['steps']['no_pager_median_s'] * 1e3:.1f} ms")
    w = record["window"]
    print(f"a window of the check (two module hooks, push and pop): {w['per_window_s'] * 1e6:.2f} us, "
          f"{w.get('window_vs_plain_op', 0):.2f}x a plain operation")
    pl = record["planning_24_layers"]
    print(f"planning {pl['saved_tensors']} saved tensors: h100 {pl['h100']['cpu_s_median'] * 1e3:.0f} ms, "
          f"link priced out {pl['h100_link_priced_out']['cpu_s_median'] * 1e3:.0f} ms (CPU time); wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
