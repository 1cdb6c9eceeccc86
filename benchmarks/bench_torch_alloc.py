"""bench_torch_alloc: tensor allocation through PyTorch with vtalloc vs PyTorch's own allocators (issue 3).

Owns: the torch-level allocation benchmark and the JSON record it writes. Not a test: it
asserts nothing about speed and lives outside ``testpaths``. Three configurations, each in its
own fresh interpreter (PyTorch's allocator can be chosen once per process), run one after the
other in one invocation on the same GPU:

* native     - PyTorch's caching allocator, default settings;
* expandable - PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
* vtalloc    - ``vtalloc.allocator.torch.enable()`` (the global pluggable allocator).

What each one times:

* empty_same  - ``torch.empty(n, dtype=uint8, device="cuda")`` then ``del``, over and over, for
                several n: the steady-state alloc+free pair as PyTorch user code sees it;
* empty_batch - 32 live tensors of sizes spread over [n/2, n] allocated, then all freed: churn
                with several live blocks, per allocation;
* train_step  - one forward/backward/AdamW step of an MLP, synchronized, per step; plus the
                peak memory each allocator reports (its own counters, in its own words).

Ratios are against native, measured in the same invocation. Without a usable CUDA device
the script says so and exits 0 without writing anything: no numbers are invented.

Run from the repository root:  python benchmarks/bench_torch_alloc.py [--quick]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lib.provenance import machine_info

KiB, MiB = 1 << 10, 1 << 20
SIZES = [512, 64 * KiB, 1 * MiB, 4 * MiB, 32 * MiB, 256 * MiB]
CONFIGS: dict[str, dict[str, str]] = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "vtalloc": {},
}
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = "benchmarks/results/torch_alloc-{date}.json"


# -- worker: runs inside one configuration's interpreter -------------------------------------------

def _time_per_op(fn: Any, ops: int, repeats: int, sync: Any) -> dict[str, Any]:
    per_op = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter_ns()
        fn()
        sync()
        per_op.append((time.perf_counter_ns() - t0) / ops)
    med = statistics.median(per_op)
    return {
        "median_ns": round(med, 1), "min_ns": round(min(per_op), 1), "max_ns": round(max(per_op), 1),
        "repeats": repeats, "ops_per_repeat": ops,
    }


def worker(config: str, quick: bool) -> dict[str, Any]:
    import torch

    vt = None
    if config == "vtalloc":
        import vtalloc.allocator.torch as vt

        vt.enable()
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    iters = 200 if quick else 2000
    repeats = 5 if quick else 9
    out: dict[str, Any] = {
        "config": config,
        "env": {k: v for k, v in CONFIGS[config].items()},
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
    }

    same, batch = {}, {}
    for n in SIZES:
        def pairs() -> None:
            for _ in range(iters):
                x = torch.empty(n, dtype=torch.uint8, device=dev)
                del x

        pairs()  # warm up: the first allocation of a size may map or cudaMalloc
        same[str(n)] = _time_per_op(pairs, iters, repeats, sync)

        sizes = [n // 2 + (n // 2) * i // 31 for i in range(32)] if n >= 2 else [n] * 32
        rounds = max(1, iters // 32)

        def churn() -> None:
            for _ in range(rounds):
                live = [torch.empty(s, dtype=torch.uint8, device=dev) for s in sizes]
                del live

        churn()
        batch[str(n)] = _time_per_op(churn, rounds * 32, repeats, sync)
    out["empty_same"] = same
    out["empty_batch"] = batch

    torch.manual_seed(0)
    width, depth, batch_size = (1024, 4, 256) if quick else (4096, 6, 512)
    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch_size, width, device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()

    for _ in range(3):
        step()
    steps = 5 if quick else 30
    step_times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter_ns()
        step()
        sync()
        step_times.append(time.perf_counter_ns() - t0)
    out["train_step"] = {
        "model": f"MLP {depth}x{width}, batch {batch_size}, AdamW, fp32",
        "median_ms": round(statistics.median(step_times) / 1e6, 3),
        "min_ms": round(min(step_times) / 1e6, 3),
        "steps": steps,
    }
    if vt is None:
        out["peak_memory"] = {
            "source": "torch.cuda.max_memory_allocated / max_memory_reserved",
            "allocated_bytes": torch.cuda.max_memory_allocated(),
            "reserved_bytes": torch.cuda.max_memory_reserved(),
        }
    else:
        m = vt.memory_stats()
        out["peak_memory"] = {
            "source": "vtalloc.allocator.torch.memory_stats (allocated: rounded live bytes; reserved: peak mapped pages)",
            "allocated_bytes": m["allocated_bytes.all.peak"],
            "reserved_bytes": m["vtalloc.mapped_bytes.peak"],
        }
        out["vtalloc_failures"] = m["vtalloc.alloc_failures"] + m["vtalloc.free_failures"]
    return out


# -- driver ------------------------------------------------------------------------------------------

def cuda_here() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as e:
        return False, f"torch is not importable: {e}"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} reports torch.cuda.is_available() == False"
    from vtalloc.allocator import backend_available

    ok, why = backend_available("cuda")
    return (True, "") if ok else (False, f"vtalloc's cuda backend is unavailable: {why}")


def run_config(config: str, quick: bool) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(CONFIGS[config])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", config] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        return {"config": config, "error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-4000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each configuration's medians divided by native's (below 1: faster than native)."""
    base = results.get("native", {})
    out: dict[str, Any] = {}
    for name, r in results.items():
        if name == "native" or "error" in r or "error" in base:
            continue
        out[name] = {
            "empty_same": {n: round(r["empty_same"][n]["median_ns"] / base["empty_same"][n]["median_ns"], 3)
                           for n in r["empty_same"]},
            "empty_batch": {n: round(r["empty_batch"][n]["median_ns"] / base["empty_batch"][n]["median_ns"], 3)
                            for n in r["empty_batch"]},
            "train_step": round(r["train_step"]["median_ms"] / base["train_step"]["median_ms"], 3),
        }
    return out


def print_table(results: dict[str, dict[str, Any]]) -> None:
    names = [n for n in CONFIGS if n in results and "error" not in results[n]]
    print(f"{'torch.empty+del, ns (median)':32}" + "".join(f"{n:>14}" for n in names))
    for size in SIZES:
        row = [results[n]["empty_same"][str(size)]["median_ns"] for n in names]
        print(f"{'same ' + str(size) + ' B':32}" + "".join(f"{v:>14.0f}" for v in row))
    for size in SIZES:
        row = [results[n]["empty_batch"][str(size)]["median_ns"] for n in names]
        print(f"{'batch of 32 up to ' + str(size) + ' B':32}" + "".join(f"{v:>14.0f}" for v in row))
    print(f"{'train step, ms (median)':32}" + "".join(f"{results[n]['train_step']['median_ms']:>14.2f}" for n in names))
    print(f"{'peak reserved/mapped, MiB':32}" + "".join(
        f"{results[n]['peak_memory']['reserved_bytes'] / MiB:>14.0f}" for n in names))
    for n, r in results.items():
        if "error" in r:
            print(f"{n}: FAILED ({r['error']})\n{r['stderr_tail']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer iterations and a smaller model (a smoke run)")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of: " + ", ".join(CONFIGS))
    p.add_argument("--out", default=DEFAULT_OUT, help="JSON path ({date} is replaced; relative to the repository)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args.quick)))
        return 0

    ok, why = cuda_here()
    if not ok:
        print(f"bench_torch_alloc: no CUDA device here ({why}); nothing was measured and nothing written.")
        return 0
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s): {', '.join(unknown)}")
    started = _dt.datetime.now(_dt.timezone.utc)
    results = {c: run_config(c, args.quick) for c in configs}
    record = {
        "schema": "vtalloc.bench.torch_alloc/v1",
        "date_utc": started.isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "quick": args.quick,
        "machine": machine_info(),
        "results": results,
        "ratio_to_native": ratios(results),
    }
    path = Path(args.out.format(date=started.strftime("%Y-%m-%dT%H%M%SZ")))
    if not path.is_absolute():
        path = REPO / path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print_table(results)
    print(f"wrote {path}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
