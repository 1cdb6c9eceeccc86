"""bench_offload_training: training with more saved activations than fit, vtalloc against every peer (issue 10).

Why this file is long: the child (one configuration) and the parent (plan, record) share the
configuration names and the JSON record; the models (lib/training_models.py), the peers and the
offloader (lib/offload_peers.py) and the checks, tables and chart (lib/offload_report.py) are
apart.

Owns: the offload-training benchmark: a parent that plans the runs, one child interpreter per
configuration (``--child``), each run's path check (``run_check``) and the JSON record.
Invariants: every configuration runs in its own fresh process (a clean CUDA context and
allocator) under the same memory cap, on the same seeded model and data; a run that runs out
of memory is a result (recorded, not retried); losses of runs at one batch are compared with a
stated relative tolerance; no figure is written that this invocation did not measure.

Configurations (GPU), per model, at the native maximum batch B (probed, or ``--batch``) and at
``--multiples`` x B (default 2 and 4):

* native       - PyTorch's caching allocator, ``set_per_process_memory_fraction(cap)``; at B only;
* uncapped     - the same with no cap, at k x B: the limit, where the GPU has room (GPU only);
* expandable   - the same with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``;
* save_on_cpu  - ``torch.autograd.graph.save_on_cpu(pin_memory=True)``;
* offloader    - :class:`StreamOffloader` (lib/offload_peers.py): saved tensors >= 1 MiB copied D2H on a side
                 stream into pinned buffers during forward, copied back on demand in backward;
* vtalloc      - ``vtalloc.allocator.torch.enable(capacity=cap)`` + ``paged_activations(None)``
                 at default settings (``--vtalloc-option k=v`` / ``--budget`` override them):
                 ``recompute="auto"``, keep, page out or recompute each saved tensor, segments
                 rebuilt once, the budget measured from the cap; on a GPU the run
                 also measures the cost model's constants (``calibration``: lib/offload_peers.py);
* vtalloc_off  - the same with ``recompute="off"``: keep or page only (offload-only);
* checkpoint   - ``torch.utils.checkpoint`` (full, per block, ``use_reentrant=False``): every
                 block's activations recomputed in backward; the peer that moves no bytes; on CPU
                 one more untimed backward counts what it recomputes, priced on the H100 model;
* checkpoint_offload - per block (reentrant) with what checkpointing keeps (block inputs, the
                 rest of the model's saved tensors) in pinned host memory (``save_on_cpu``): the
                 checkpointing peer that fits ResNet-50 at 4x under 16 GiB;
* compile      - ``torch.compile`` with ``torch._functorch.config.activation_memory_budget``
                 (``--compile-memory-budget``, default 0.3), where it compiles (GPU default list).

Runs start in ``RUN_ORDER`` (the comparison's first), and on a GPU the whole invocation stops
starting runs after ``--time-limit`` (220 s), cutting the one under way there: the JSON is
always written, what did not run recorded as skipped.

Models: ResNet-50 (torchvision's, or where torchvision does not import lib/resnet50_stand_in.py's
network with the same layers: ``model_source`` in each run; channels_last, 224x224) and a
transformer (8 x TransformerEncoderLayer(2048, 16 heads, 8192), seq 1024), bf16 autocast, SGD.
On CPU (fp32, one thread per child) ``resnet50`` runs too (``--batch resnet50=2``: about 1.5 s
per plain step), and ``gpt2`` and ``llama`` (``transformers`` models from small configs, random
weights: GPT-2 with its default dropout 0.1, so recompute replays RNG; a Llama-style decoder),
eager attention.

``--cpu-smoke`` runs a tiny version on CPU (a small CNN and a 2-layer transformer, 3 steps):
native, save_on_cpu, the offloader (synchronous copies: CPU has no copy stream) and vtalloc's
``paged_activations`` over a host-backend AddressSpace of 256 KiB pages (the 4 MiB cap would be
two 2 MiB pages, fewer than a backward step holds); it checks the script, not GPU speed.
With ``--budget-fraction F`` each CPU child first counts the bytes one plain forward saves (as the
pager would take them) and its FLOPs (``torch.utils.flop_counter.FlopCounterMode``), sets the
budget of both vtalloc configurations to F x those bytes (the same budget for both) and sizes the
space to hold them all; per scheduled step it reports the pager's measured bytes over the copy
link (``step_bytes_paged``), bytes and FLOPs recomputed, kept bytes and the space's peak mapped
bytes against the budget, the FLOPs run again at unpack (later iterations verify by the trace
check, which runs no recipe), the plan's modelled H100 time beside per-block checkpointing's (a
prediction), the recorded step's time, and every run's gradients of the last step are compared
bit for bit with ``native`` at the same batch.
Every run that finished checks it took the path its configuration names (``run_check``: the
paging configurations paged, the copying peers copied, the others moved nothing; recorded as
``path_check`` per run and ``path_checked``); a miss makes the script exit 1, naming the run.

    python benchmarks/bench_offload_training.py --chart benchmarks/results/offload_training.png
    python benchmarks/bench_offload_training.py --cpu-smoke --out /tmp/smoke.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the library (benchmarks/lib/) sits beside this file

from lib.offload_peers import (  # noqa: E402
    CPU_CONFIGS,
    GPU_CONFIGS,
    PAGER_CONFIGS,
    RUN_ORDER,
    RecomputeCount,
    StreamOffloader,
    calibrate,
    checkpoint_blocks,
    compiled,
    counted_save_on_cpu,
)
from lib.offload_report import chart, check_grads, check_losses, recompute_rows, recompute_table, table  # noqa: E402
from lib.path_check import check, failed, summary  # noqa: E402
from lib.training_models import build, measure_forward, resnet50_source  # noqa: E402

MiB = 1 << 20
GPU_TIME_LIMIT_S = 220.0  # the default --time-limit on a GPU: the whole invocation well under 5 minutes
PROBE_START = {"resnet50": 32, "transformer": 2}


# -- child: one configuration in its own interpreter ----------------------------------------------

def is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    cuda, name = cfg["device"] == "cuda", cfg["config"]
    torch.backends.cudnn.benchmark = False  # enable() requires it; the same for every configuration
    if not cuda:
        torch.set_num_threads(1)
    if cfg.get("deterministic"):
        torch.backends.cudnn.deterministic = True
    space = vt = None
    if name in PAGER_CONFIGS and cuda:
        import vtalloc.allocator.torch as vt

        vt.enable(capacity=cfg["cap"], **cfg.get("vtalloc_options", {}))
    elif cuda and name != "uncapped":  # uncapped: the limit, where the GPU has room
        total = torch.cuda.get_device_properties(0).total_memory
        from vtalloc.allocator.config import parse_size  # the cap is given as text ("16GiB")

        torch.cuda.set_per_process_memory_fraction(min(1.0, parse_size(cfg["cap"]) / total), 0)
    device = "cuda" if cuda else "cpu"
    if cfg.get("probe"):
        return probe(torch, cfg, device)
    out: dict[str, Any] = {"config": name, "model": cfg["model"], "batch": cfg["batch"]}
    if cfg["model"] == "resnet50":
        out["model_source"] = resnet50_source()
    if cuda:
        p = torch.cuda.get_device_properties(0)
        out["gpu"] = {"name": p.name, "total_memory_bytes": p.total_memory, "cuda": torch.version.cuda,
                      "torch": torch.__version__}
        if name == "vtalloc":  # the cost model's constants on this GPU, before the model takes memory
            try:
                out["calibration"] = calibrate(torch)
            except Exception as e:  # noqa: BLE001 - a failed probe must not cost the run it precedes
                out["calibration"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    try:
        net, x, y, loss_fn = build(torch, cfg["model"], cfg["batch"], device)
    except Exception as e:  # noqa: BLE001 - an OOM while building is a result
        if not is_oom(e):
            raise
        return {**out, "status": "oom", "oom_at_step": -1, "error": str(e).splitlines()[0][:300]}
    budget, cap = cfg.get("budget"), cfg["cap"]
    if not cuda and cfg.get("budget_fraction"):
        # The same budget for every configuration of this model and batch: a fraction of what one
        # plain forward saves (counted as the pager takes tensors); the space holds them all.
        fwd = measure_forward(torch, net, x)
        out["forward"] = fwd
        budget = max(int(fwd["saved_bytes"] * cfg["budget_fraction"]), 1)
        cap = max(parse_bytes(cap), 2 * fwd["saved_bytes"] + 16 * MiB)
    if name in PAGER_CONFIGS and not cuda:
        from vtalloc.allocator import AddressSpace

        space = AddressSpace(backend="host", capacity=cap, host_capacity=cfg.get("host_capacity", "1GiB"),
                             **cfg.get("vtalloc_options", {}))
    if name in ("checkpoint", "checkpoint_offload"):
        net = checkpoint_blocks(torch, cfg["model"], net, reentrant=name == "checkpoint_offload")
    elif name == "compile":
        net = compiled(torch, net, cfg["compile_budget"])
        out["compile_activation_memory_budget"] = cfg["compile_budget"]
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    moved = {"d2h": 0, "h2d": 0}
    offloader = pager = None
    if name in ("save_on_cpu", "checkpoint_offload"):  # the second: what checkpointing keeps goes to the host
        saved_ctx = counted_save_on_cpu(torch, moved)
        scope = lambda: saved_ctx  # noqa: E731 - the same hooks object every step
    elif name == "offloader":
        offloader = StreamOffloader(cfg.get("offload_min_bytes", MiB))
        scope = offloader.hooks
    elif name in PAGER_CONFIGS:
        from vtalloc.allocator.torch import paged_activations

        extra = {"max_recompute_fraction": cfg["max_recompute_fraction"]} \
            if cfg.get("max_recompute_fraction") is not None else {}
        pager = paged_activations(space, budget, recompute=PAGER_CONFIGS[name], cost_model=cost_model(cfg), **extra)
        scope = lambda: pager  # noqa: E731 - one pager for every step: it learns the order
        out["budget_bytes"] = pager.budget
    else:
        scope = contextlib.nullcontext
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def counters() -> dict[str, int]:
        if name in PAGER_CONFIGS:
            s = (vt.stats() if cuda else space.stats()).as_dict()
            return {k: v for k, v in s.items() if isinstance(v, int) and not isinstance(v, bool)}
        if offloader is not None:
            return {"d2h": offloader.d2h_bytes, "h2d": offloader.h2d_bytes}
        return dict(moved)

    losses, times, before, steps = [], [], {}, []
    if cuda and name not in PAGER_CONFIGS:
        torch.cuda.reset_peak_memory_stats()
    for step in range(cfg["steps"]):
        if step == cfg["warmup"]:
            before = counters()
        if space is not None and step >= cfg["warmup"]:
            # this step's peak mapped bytes: the ranges earlier steps freed stay cached until trimmed
            space.trim()
            space.reset_peak_stats()
        t0 = time.perf_counter()
        try:
            opt.zero_grad(set_to_none=True)
            with scope(), autocast:
                loss = loss_fn(net(x), y)
            fwd_peak = space.stats().peak_mapped_bytes if space is not None else None
            loss.backward()
            if step == cfg["steps"] - 1 and cfg.get("grads_out"):
                torch.save([p.grad for p in net.parameters()], cfg["grads_out"])
            if pager is not None and step >= cfg["warmup"]:
                steps.append({**pager_step(pager, space), "forward_peak_mapped_bytes": fwd_peak})
            opt.step()
            sync()
        except Exception as e:  # noqa: BLE001
            if name == "compile" and not is_oom(e):  # "where it compiles": a failure to compile is a result
                out.update(status="compile_error", error=f"{type(e).__name__}: {str(e)[:300]}", losses=losses)
                break
            if not is_oom(e):
                raise
            out.update(status="oom", oom_at_step=step, error=str(e).splitlines()[0][:300], losses=losses)
            break
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    else:
        out["status"] = "ok"
    timed = times[cfg["warmup"]:]
    if out["status"] == "ok" and timed:
        after = counters()
        delta = {k: after[k] - before.get(k, 0) for k in after}
        n = len(timed)
        out.update(losses=losses, step_s=times, median_step_s=statistics.median(timed),
                   samples_per_s=cfg["batch"] / statistics.median(timed), timed_steps=n)
        if name in PAGER_CONFIGS:
            moved_b = delta.get("bytes_evicted_total", 0) + delta.get("bytes_restored_total", 0)
            out["budget_bytes"] = pager.budget  # the default one is measured in the recorded iteration
            out["recorded_step_s"] = times[0]   # the recorder, every recipe verified, the plan made after it
            out["vtalloc_stats_delta_per_step"] = {k: v / n for k, v in delta.items() if v}
            out["pager"] = dataclasses.asdict(pager.stats())
            out["bytes_moved_how"] = "vtalloc Stats: bytes_evicted_total + bytes_restored_total"
            out["pager_steps"] = steps
            out["pager_step"] = steps[-1]  # the last scheduled step (every scheduled step is planned alike)
            plan = pager.plan()
            if plan is not None:
                out["plan_summary"] = {**dataclasses.asdict(plan.summary), "modelled_s": plan.summary.modelled_s,
                                       "decisions": {d: sum(r.decision == d for r in plan.rows)
                                                     for d in ("keep", "page", "recompute", "shared")},
                                       "note": "modelled H100 time the plan adds to a step: a prediction"}
        else:
            moved_b = delta.get("d2h", 0) + delta.get("h2d", 0)
            out["bytes_moved_how"] = {"save_on_cpu": "counted in save_on_cpu's hooks (pack copies, unpack copies)",
                                      "checkpoint_offload": "counted in save_on_cpu's hooks around the checkpoints",
                                      "offloader": "counted in the offloader's hooks"}.get(name, "none: nothing moves")
            if name == "checkpoint" and not cuda:
                out["modelled_recompute"] = count_recompute(torch, net, x, y, loss_fn, cfg)
        out["bytes_moved_per_step"] = moved_b / n
        out["path_check"] = run_check(out)
    out.update(peak_memory(torch, cuda, name, vt, space))
    if space is not None:
        del pager, net, opt, x, y, scope
        space.close()
    return out


def cost_model(cfg: dict[str, Any]) -> Any:
    """The plan's cost model: the H100's, or with the copy link priced out (every plan recomputes
    what it can: the exactness of recompute-heavy plans, measured)."""
    from vtalloc.allocator.activation_costs import H100

    if cfg.get("cost_model") == "h100-link-priced-out":
        return dataclasses.replace(H100, link_bytes_per_s=1e3, name="h100, link priced out")
    return H100


def count_recompute(torch: Any, net: Any, x: Any, y: Any, loss_fn: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """One more forward and backward (after the timed steps and the saved gradients; no optimizer
    step): what checkpointing runs again, priced on the H100 cost model, as the plan is."""
    from vtalloc.allocator.activation_costs import H100

    count = RecomputeCount(H100)
    net.zero_grad(set_to_none=True)
    loss = loss_fn(net(x), y)
    with count.mode:
        loss.backward()
    return {"ops": count.ops, "flops": count.flops, "h100_s": count.seconds, "cost_model": H100.name,
            "note": "modelled H100 time checkpointing's recompute adds to a step: a prediction"}


def run_check(out: dict[str, Any]) -> dict[str, Any]:
    """Did the run take the path its configuration names? vtalloc paged or recomputed in the timed
    steps (its plan may do either with what exceeds the budget); vtalloc_off paged: the pager
    offloaded saved tensors and the space moved bytes, and it recomputed nothing; save_on_cpu and the offloader copied bytes out and
    back (checkpoint_offload too); native, uncapped, expandable, checkpoint and compile moved none.
    The configuration's process ran with expandable segments exactly when it is named ``expandable``."""
    name = out["config"]
    moved = out["bytes_moved_per_step"]
    measured: dict[str, Any] = {"bytes_moved_per_step": moved,
                                "expandable_segments": "expandable_segments:True" in
                                os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    expected: dict[str, Any] = {"expandable_segments": name == "expandable"}
    if name == "vtalloc":  # the plan may page, recompute or both: the excess over the budget went somewhere
        measured["bytes_paged_or_recomputed"] = out["pager_step"]["bytes_paged"] + out["pager_step"]["bytes_recomputed"]
        expected["bytes_paged_or_recomputed"] = {"min": 1}
    elif name == "vtalloc_off":
        measured["pager_offloads"] = out["pager"]["offloads"]
        measured["bytes_recomputed"] = out["pager_step"]["bytes_recomputed"]
        expected.update(bytes_moved_per_step={"min": 1}, pager_offloads={"min": 1}, bytes_recomputed=0)
    elif name in ("save_on_cpu", "offloader", "checkpoint_offload"):
        expected["bytes_moved_per_step"] = {"min": 1}
    else:
        expected["bytes_moved_per_step"] = 0
    return check(f"{out['model']} batch {out['batch']} {name}", name, expected, measured)


def pager_step(pager: Any, space: Any) -> dict[str, Any]:
    """What the pager did in the step just run (its forward and backward)."""
    st = pager.stats()
    # the first iteration records; a step follows the plan when every later one did (no fallback)
    row = {"scheduled": st.scheduled_iterations == st.iterations - 1 and st.fallback_iterations == 0,
           "bytes_paged": st.step_bytes_paged, "bytes_recomputed": st.step_bytes_recomputed,
           "recompute_flops": st.step_recompute_flops, "checked_ops": getattr(st, "step_checked_ops", 0),
           "kept_bytes": st.step_kept_bytes, "recompute_fallbacks_total": st.recompute_fallbacks,
           "recompute_diverged_total": getattr(st, "recompute_diverged", 0),  # (bench_pager_overhead: older trees)
           "passed_through_no_room_total": st.passed_through_no_room}
    if space is not None:  # forward and backward (backward's freed ranges stay cached: docs/eviction.md)
        row["step_peak_mapped_bytes"] = space.stats().peak_mapped_bytes
    return row


def parse_bytes(size: Any) -> int:
    from vtalloc.allocator.config import parse_size

    return parse_size(size, name="cap")


def peak_memory(torch: Any, cuda: bool, name: str, vt: Any, space: Any) -> dict[str, Any]:
    if name in PAGER_CONFIGS:
        s = vt.stats() if cuda else space.stats()
        return {"peak_bytes": s.peak_mapped_bytes, "peak_allocated_bytes": s.peak_active_bytes,
                "peak_how": "vtalloc peak_mapped_bytes (pages mapped) / peak_active_bytes"}
    if cuda:
        return {"peak_bytes": torch.cuda.max_memory_reserved(), "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                "peak_how": "torch.cuda.max_memory_reserved / max_memory_allocated"}
    import resource

    return {"peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "peak_allocated_bytes": None,
            "peak_how": "process max RSS (CPU: device and host memory are one)"}


def probe(torch: Any, cfg: dict[str, Any], device: str) -> dict[str, Any]:
    """Largest power-of-two batch that trains two steps under the cap (native allocator)."""
    best, batch, tried = None, PROBE_START.get(cfg["model"], 1), []
    while batch <= cfg.get("probe_max", 1 << 14):
        try:
            net, x, y, loss_fn = build(torch, cfg["model"], batch, device)
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
            for _ in range(2):
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn(net(x), y)
                loss.backward()
                opt.step()
            torch.cuda.synchronize()
            best = batch
            tried.append([batch, "ok"])
        except Exception as e:  # noqa: BLE001
            if not is_oom(e):
                raise
            tried.append([batch, "oom"])
            break
        finally:
            net = x = y = opt = loss = None
            torch.cuda.empty_cache()
        batch *= 2
    return {"probe": True, "max_batch": best, "tried": tried}


# -- parent -----------------------------------------------------------------------------------------

def run_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if cfg["config"] == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True,
                           env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**cfg, "status": "timeout"}
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        res = {"status": "error", "returncode": p.returncode, "error": "\n".join(lines[-5:])}
    res["process_wall_s"] = round(time.perf_counter() - t0, 2)
    return {"config": cfg["config"], "model": cfg["model"], "batch": cfg.get("batch"), **res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny models on CPU over the host backend")
    ap.add_argument("--models", default=None,
                    help="comma-separated (GPU: resnet50,transformer; CPU: cnn,tiny_transformer,gpt2,llama,resnet50)")
    ap.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(GPU_CONFIGS)}")
    ap.add_argument("--cap", default=None, help="memory cap per process (GPU default 16GiB, smoke 4MiB)")
    ap.add_argument("--batch", default=None, help="native batch per model (model=N,...), else probed (GPU)")
    ap.add_argument("--multiples", default=None, help="batches of the offloading configs, x native batch (GPU 2,4; smoke 2)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (GPU 8, smoke 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (GPU 3, smoke 1)")
    ap.add_argument("--budget", default=None,
                    help="paged_activations budget (default: its own, the cap less the model's memory, measured)")
    ap.add_argument("--budget-fraction", type=float, default=None,
                    help="CPU: budget = this fraction of the bytes one plain forward saves (overrides --budget)")
    ap.add_argument("--max-recompute-fraction", type=float, default=None,
                    help="paged_activations' cap on recompute FLOPs, a share of the forward's (its default: none, "
                         "the cost model decides)")
    ap.add_argument("--cost-model", default="h100", choices=["h100", "h100-link-priced-out"],
                    help="the plan's cost model (the second prices paging out: the plan recomputes what it can)")
    ap.add_argument("--compile-memory-budget", type=float, default=0.3,
                    help="compile: torch._functorch.config.activation_memory_budget (the share of activation memory "
                         "the partitioner keeps)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help=f"seconds for the whole invocation: no run starts after it, the one under way is cut at it "
                         f"(recorded as skipped / timeout; the JSON is written). GPU default {GPU_TIME_LIMIT_S:g}, "
                         "CPU none; 0: none")
    ap.add_argument("--vtalloc-option", action="append", default=[], help="k=v passed to enable() / AddressSpace")
    ap.add_argument("--loss-rtol", type=float, default=None, help="GPU 2e-2 (bf16, cuDNN), smoke 1e-5")
    ap.add_argument("--deterministic", action="store_true", help="cudnn.deterministic in every child")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child")
    ap.add_argument("--out", default="benchmarks/results/offload_training-{device}-{date}.json")
    ap.add_argument("--chart", default=None, help="PNG path (needs matplotlib)")
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    smoke = a.cpu_smoke
    device = "cpu" if smoke else "cuda"
    if not smoke:
        import torch

        if not torch.cuda.is_available():
            print("cuda: not available here (use --cpu-smoke for the CPU version); nothing measured")
            return 0
    models = (a.models or ("cnn,tiny_transformer" if smoke else "resnet50,transformer")).split(",")
    configs = (a.configs or ",".join(CPU_CONFIGS if smoke else GPU_CONFIGS)).split(",")
    for gpu_only in ("expandable", "uncapped"):  # a CUDA allocator setting, a GPU's memory: nothing to run on CPU
        if smoke and gpu_only in configs:
            configs.remove(gpu_only)
    limit = a.time_limit if a.time_limit is not None else (0.0 if smoke else GPU_TIME_LIMIT_S)
    started = time.perf_counter()
    multiples = [int(m) for m in (a.multiples or ("2" if smoke else "2,4")).split(",") if m]
    given = dict(kv.split("=") for kv in a.batch.split(",")) if a.batch else {}
    opts = dict(kv.split("=", 1) for kv in a.vtalloc_option)
    if smoke:  # a 4 MiB cap is two 2 MiB pages: too coarse for the pages a backward step holds
        opts = {"page_size": "256KiB", "host_granularity": "256KiB", **opts}
    base = {"device": device, "cap": a.cap or ("4MiB" if smoke else "16GiB"), "steps": a.steps or (3 if smoke else 8),
            "warmup": a.warmup if a.warmup is not None else (1 if smoke else 3), "budget": a.budget,
            "vtalloc_options": opts, "deterministic": a.deterministic,
            "offload_min_bytes": 64 * 1024 if smoke else MiB,  # smoke: its tensors are small
            "budget_fraction": a.budget_fraction if smoke else None,
            "max_recompute_fraction": a.max_recompute_fraction, "compile_budget": a.compile_memory_budget,
            "cost_model": a.cost_model,
            "time_limit_s": limit}
    rtol = a.loss_rtol if a.loss_rtol is not None else (1e-5 if smoke else 2e-2)
    runs, probes = [], {}
    grads_dir = tempfile.TemporaryDirectory(prefix="bench_offload_grads-") if smoke else None
    for m in models:
        if m in given or smoke:
            native_batch = int(given.get(m, 8))
        else:
            pr = run_child({**base, "config": "native", "model": m, "probe": True}, a.timeout)
            probes[m] = pr
            native_batch = pr.get("max_batch")
            print(f"{m}: largest power-of-two batch under the cap (native): {native_batch} {pr.get('tried', pr)}",
                  flush=True)
            if not native_batch:
                continue
        plan = [("native", native_batch)] if "native" in configs else []
        for k in multiples:
            plan += [(c, k * native_batch) for c in configs
                     if (c != "native" or smoke) and (c, k * native_batch) not in plan]
        plan.sort(key=lambda cb: RUN_ORDER.index(cb[0]) if cb[0] in RUN_ORDER else len(RUN_ORDER))
        for c, b in plan:
            grads = {"grads_out": os.path.join(grads_dir.name, f"{m}-{b}-{c}.pt")} if grads_dir else {}
            left = limit - (time.perf_counter() - started) if limit else a.timeout
            if left <= 0:
                r = {"config": c, "model": m, "batch": b, "status": "skipped", "error": "time limit"}
            else:
                r = run_child({**base, "config": c, "model": m, "batch": b, **grads}, min(a.timeout, left))
                if r.get("status") == "timeout" and left < a.timeout:
                    r["cut_by_time_limit"] = True
            r.update(grads)
            runs.append(r)
            # a stage cut short (a lent GPU's time limit) still leaves the runs it finished
            partial = Path(a.out.format(device=device, date=_dt.date.today().isoformat()) + ".partial")
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"benchmark": "offload_training", "partial": True, "settings": base,
                                           "runs": runs}, indent=1, default=str) + "\n")
            print(f"  {m:16s} batch {b:5d} {c:12s} {r.get('status')}"
                  + (f"  {r['median_step_s']:.4f} s/step  {r['samples_per_s']:.1f} samples/s" if r.get("status") == "ok"
                     else f"  {r.get('error', '')[:120]}"), flush=True)
    checks = check_losses(runs, rtol)
    grad_checks = check_grads(runs) if grads_dir else []
    rec_rows = recompute_rows(runs)
    for r in runs:
        r.pop("grads_out", None)  # a temporary file, gone with this process
    if grads_dir:
        grads_dir.cleanup()
    paging_exact = all(c["bit_identical"] for c in grad_checks if c["config"] in PAGER_CONFIGS)
    path_checks = [r["path_check"] for r in runs if "path_check" in r]  # runs that finished ("ok")
    record: dict[str, Any] = {
        "benchmark": "offload_training", "device": device, "cpu_smoke": smoke,
        "provenance": {"date": _dt.date.today().isoformat(), "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
                       **_provenance(device), "gpu": next((r["gpu"] for r in runs if "gpu" in r), None)},
        "settings": {**base, "models": models, "configs": configs, "multiples": multiples, "loss_rtol": rtol},
        "probes": probes, "runs": runs, "loss_checks": checks, "losses_match": all(c["equal"] for c in checks),
        "grad_checks": grad_checks, "vtalloc_grads_bit_identical": paging_exact, "recompute": rec_rows,
        "path_checked": summary(path_checks), "notes": a.note}
    if a.chart:
        record["chart"] = chart(runs, a.chart, f"offload training, {device}, cap {base['cap']}, {record['provenance']['date']}")
    out = Path(a.out.format(device=device, date=record["provenance"]["date"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    Path(str(out) + ".partial").unlink(missing_ok=True)  # the whole record replaces it
    print(table(runs, checks))
    if rec_rows:
        print(recompute_table(rec_rows))
    if grad_checks:
        print(f"vtalloc gradients bit-identical to native: {paging_exact}")
    print(f"losses match (rtol {rtol:g}): {record['losses_match']}; wrote {out}" + (f"; chart: {record['chart']}" if a.chart else ""))
    crashed = [r for r in runs if r.get("status") not in ("ok", "oom", "skipped", "compile_error")
               and not r.get("cut_by_time_limit")]
    if failed(path_checks):
        print("PATH CHECK FAILED: runs measured another path than their configuration names:\n  "
              + "\n  ".join(failed(path_checks)), file=sys.stderr)
    return 0 if record["losses_match"] and paging_exact and not crashed and not failed(path_checks) else 1


def _provenance(device: str) -> dict[str, Any]:
    from lib.provenance import git_info, machine_info

    info: dict[str, Any] = {"machine": machine_info(), "git": git_info()}
    try:
        import torch

        info["torch"] = torch.__version__  # the GPU is described by each child (runs[].gpu): the parent
        # creates no CUDA context, which would take device memory from the children
    except Exception as e:  # noqa: BLE001
        info["torch"] = f"unavailable: {e}"
    return info


if __name__ == "__main__":
    sys.exit(main())
