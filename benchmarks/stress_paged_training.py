"""Repeat in-place paged training many times and count the runs that die.

The configuration that once failed 1 run in 5 with CUDA_ERROR_ILLEGAL_ADDRESS (a mapping changed
under a running kernel, fixed by the ordering rules in docs/eviction.md): torchvision ResNet-50,
batch 1024, bf16 autocast, channels_last, SGD, under
``enable(capacity="16GiB", evict_mode="mapped", page_size=P)`` with
``paged_activations(None, budget="6GiB")``. Each run is a fresh interpreter (the allocator is
chosen once per process, and an illegal address ends the CUDA context); the parent records,
per run, how it ended (exit status, signal, the last error line), its step time and losses.

    python benchmarks/stress_paged_training.py --pages 2MiB,32MiB,64MiB --runs 10
    python benchmarks/stress_paged_training.py --device cpu --runs 2 --steps 3   # harness check on CPU

``--device cpu`` runs the same harness over a host-backend space with a small CNN
(``paged_activations(space)``): it checks the script, not the GPU path. Writes JSON to
``benchmarks/results/stress_paged-{device}-{date}.json``; exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lib.provenance import git_info, machine_info

CHILD = r"""
import json, sys, time
import torch
cfg = json.loads(sys.argv[1])
torch.manual_seed(0)
if cfg["device"] == "cuda":
    import vtalloc.allocator.torch as vt
    from vtalloc.allocator.torch import paged_activations
    import torchvision
    vt.enable(capacity=cfg["capacity"], evict_mode="mapped", page_size=cfg["page"])
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(cfg["batch"], 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (cfg["batch"],), device="cuda")
    pager = paged_activations(None, budget=cfg["budget"])
    autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    sync = torch.cuda.synchronize
else:
    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.torch import paged_activations
    space = AddressSpace(backend="host", capacity=cfg["capacity"], page_size=cfg["page"], host_capacity="1GiB")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(512, 10))
    x = torch.randn(cfg["batch"], 3, 64, 64)
    y = torch.randint(0, 10, (cfg["batch"],))
    pager = paged_activations(space, budget=cfg["budget"])
    import contextlib
    autocast = contextlib.nullcontext
    sync = lambda: None
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses, times = [], []
for step in range(cfg["steps"]):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with pager, autocast():
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    sync()
    times.append(time.perf_counter() - t0)
    losses.append(float(loss))
ps = pager.stats()
print(json.dumps({"losses": losses, "step_s": times, "offloads": ps.offloads, "prefetches": ps.prefetches,
                  "on_demand": ps.on_demand}))
"""


def run_once(cfg: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "ended": "timeout", "wall_s": time.perf_counter() - t0}
    out: dict = {"wall_s": round(time.perf_counter() - t0, 2), "returncode": proc.returncode}
    if proc.returncode < 0:
        out["ended"] = f"signal {-proc.returncode}"
    elif proc.returncode:
        out["ended"] = "error"
    else:
        out["ended"] = "ok"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode:
        out["last_error"] = next((line for line in reversed(lines) if "Error" in line or "error" in line),
                                 lines[-1] if lines else "")
        out["illegal_address"] = "ILLEGAL_ADDRESS" in proc.stderr or "illegal memory access" in proc.stderr
    try:
        out.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        pass
    out["ok"] = proc.returncode == 0 and "losses" in out
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--pages", default=None, help="comma-separated page sizes (cuda default 2MiB,32MiB,64MiB)")
    ap.add_argument("--runs", type=int, default=10, help="runs per page size")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=None, help="cuda default 1024, cpu default 64")
    ap.add_argument("--capacity", default=None, help="cuda default 16GiB, cpu default 64MiB")
    ap.add_argument("--budget", default=None, help="cuda default 6GiB, cpu default 8MiB")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--out", default=None)
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args()
    cuda = a.device == "cuda"
    pages = (a.pages or ("2MiB,32MiB,64MiB" if cuda else "2MiB")).split(",")
    base = {"device": a.device, "steps": a.steps, "batch": a.batch or (1024 if cuda else 64),
            "capacity": a.capacity or ("16GiB" if cuda else "64MiB"), "budget": a.budget or ("6GiB" if cuda else "8MiB")}
    results = []
    for page in pages:
        for i in range(a.runs):
            r = run_once({**base, "page": page}, a.timeout)
            r.update(page=page, run=i)
            results.append(r)
            steps = r.get("step_s") or []
            med = sorted(steps[2:] or steps)[len(steps[2:] or steps) // 2] if steps else None
            print(f"page {page:>6} run {i + 1:2d}/{a.runs}: {r['ended']:<10} "
                  + (f"median step {med:.3f} s" if med else r.get("last_error", "")), flush=True)
    summary = {}
    for page in pages:
        rs = [r for r in results if r["page"] == page]
        summary[page] = {"runs": len(rs), "failed": sum(not r["ok"] for r in rs),
                         "illegal_address": sum(bool(r.get("illegal_address")) for r in rs)}
    print(json.dumps(summary))
    date = dt.date.today().isoformat()
    out = Path(a.out or Path(__file__).parent / "results" / f"stress_paged-{a.device}-{date}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": date, "command": " ".join([Path(sys.executable).name] + sys.argv),
                               "machine": machine_info(), "git": git_info(), "config": base, "notes": a.note,
                               "summary": summary, "runs": results}, indent=1))
    print(f"wrote {out}")
    return 0 if all(s["failed"] == 0 for s in summary.values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
