"""bench_churn: thousands of random-size tensors allocated and freed under a memory cap (issue 10, item 4).

Owns: the seeded churn sequence (churn_ops), its replay through PyTorch on a GPU for each
allocator (native caching allocator, expandable segments, vtalloc ``enable()``, each in its own
process) and through a host-backend ``AddressSpace`` on CPU, and the JSON record.
Invariants: every configuration replays the same sequence (a seed and the sizes decide it, never
what happened in an earlier run); the sequence never holds more live bytes, rounded up to whole
pages, than ``--live-fraction`` of the cap, so an out-of-memory error during the replay is
fragmentation, not demand; an allocation that fails is counted and skipped (its later free is a
no-op); vtalloc must finish with 0 OOMs (its invariant: any free page can back any allocation),
else the script exits 1; so does a run whose allocator is not the one it names (``path_check`` in
each run, ``path_checked`` in the record: the counters of the allocator named grew by the
allocations served; on the host, exactly, with the cap reached).

    python benchmarks/bench_churn.py                       # GPU: native, expandable, vtalloc
    python benchmarks/bench_churn.py --backend host        # CPU: vtalloc's AddressSpace, scaled down
    python benchmarks/bench_churn.py --backend host --ops 300 --cap 64MiB --max-size 16MiB --out /tmp/c.json

GPU defaults: cap 90% of the device's memory, sizes 1 MiB-512 MiB (log-uniform), 4000 ops.
Host defaults: cap 512 MiB, sizes 1 MiB-96 MiB, 3000 ops. ``--space-option k=v`` passes options
to ``enable()`` / ``AddressSpace`` (a page size, say, or a cost model where the core has one).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # path_check and provenance sit beside this file

from lib.path_check import check, failed, summary  # noqa: E402

MiB = 1 << 20
PAGE = 2 * MiB
GPU_CONFIGS = ["native", "expandable", "vtalloc"]


def churn_ops(seed: int, n_ops: int, min_bytes: int, max_bytes: int, live_limit: int,
              page: int = PAGE) -> list[tuple[str, int, int]]:
    """("alloc", id, bytes) / ("free", id, 0) ops. Sizes log-uniform in [min, max] (512 B
    multiples); allocates with probability 0.6 while the live bytes (pages rounded up) stay
    within ``live_limit``, so the live set hovers near the limit; frees a random live one."""
    if max_bytes > live_limit or min_bytes > max_bytes or min_bytes < 512:
        raise ValueError(f"need 512 <= min ({min_bytes}) <= max ({max_bytes}) <= live limit ({live_limit})")
    rng = random.Random(seed)
    live: dict[int, int] = {}
    live_bytes, next_id, ops = 0, 0, []
    lo, hi = math.log(min_bytes), math.log(max_bytes)
    while len(ops) < n_ops:
        size = max(512, int(math.exp(rng.uniform(lo, hi))) // 512 * 512)
        rounded = -(-size // page) * page
        if live and (live_bytes + rounded > live_limit or rng.random() >= 0.6):
            victim = rng.choice(sorted(live))
            live_bytes -= -(-live.pop(victim) // page) * page
            ops.append(("free", victim, 0))
        elif live_bytes + rounded <= live_limit:
            live[next_id] = size
            live_bytes += rounded
            ops.append(("alloc", next_id, size))
            next_id += 1
    return ops


def replay(ops: list[tuple[str, int, int]], alloc: Any, free: Any, is_oom: Any, sync: Any = None) -> dict[str, Any]:
    """Run the ops; returns time, counts and the first OOMs (size, live bytes then)."""
    live: dict[int, Any] = {}
    live_bytes = ooms = allocs = frees = 0
    examples = []
    t0 = time.perf_counter()
    for op, ident, size in ops:
        if op == "alloc":
            try:
                live[ident] = (alloc(size), size)
                live_bytes += size
                allocs += 1
            except Exception as e:  # noqa: BLE001
                if not is_oom(e):
                    raise
                ooms += 1
                if len(examples) < 5:
                    examples.append({"bytes": size, "live_bytes": live_bytes, "error": str(e).splitlines()[0][:200]})
        elif ident in live:
            handle, n = live.pop(ident)
            free(handle)
            live_bytes -= n
            frees += 1
    if sync is not None:
        sync()
    elapsed = time.perf_counter() - t0
    for handle, _ in live.values():
        free(handle)
    return {"time_s": elapsed, "ops": len(ops), "allocs": allocs, "frees": frees, "ooms": ooms,
            "oom_examples": examples, "us_per_op": elapsed / len(ops) * 1e6}


def int_fields(stats: Any) -> dict[str, int]:
    return {k: v for k, v in stats.as_dict().items() if isinstance(v, int) and not isinstance(v, bool)}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def is_oom(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()


def resolve_cap(spec: str, total: int | None) -> int:
    from vtalloc.allocator.config import parse_size

    if spec.endswith("%"):
        if total is None:
            raise ValueError("a cap in % needs a device size")
        return int(total * float(spec[:-1]) / 100) // PAGE * PAGE
    return parse_size(spec, name="cap")


# -- GPU child: one allocator in its own interpreter -------------------------------------------------

def device_total_bytes(torch: Any) -> int:
    """The device's memory, read without initializing torch's CUDA allocator: vtalloc's enable()
    must come before that (torch chooses its allocator once), and torch.cuda.get_device_properties
    initializes it. vtalloc's device_info asks the driver (cuda-python); torch's figure only where
    that cannot."""
    try:
        from vtalloc.allocator.device_info import device_info

        return device_info(0).total_bytes
    except Exception:  # noqa: BLE001 - no cuda-python: torch's answer (initializes its allocator)
        return torch.cuda.get_device_properties(0).total_memory


def start_allocator(name: str, cap_spec: str, space_options: dict[str, Any], torch: Any) -> tuple[int, Any]:
    """(cap in bytes, vtalloc's torch module or None) with the allocator ``name`` in force in this
    process: vtalloc's enable() before anything initializes torch's CUDA allocator."""
    if name == "vtalloc":
        import vtalloc.allocator.torch as vt

        cap = resolve_cap(cap_spec, device_total_bytes(torch) if cap_spec.endswith("%") else None)
        vt.enable(capacity=cap, **space_options)
        return cap, vt
    total = torch.cuda.get_device_properties(0).total_memory
    cap = resolve_cap(cap_spec, total)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
    return cap, None


def gpu_child(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    name = cfg["config"]
    if not torch.cuda.is_available():
        return {"config": name, "status": "no_cuda"}
    cap, vt = start_allocator(name, cfg["cap"], cfg["space_options"], torch)
    props = torch.cuda.get_device_properties(0)
    ops = churn_ops(cfg["seed"], cfg["ops"], cfg["min_bytes"], cfg["max_bytes"], int(cap * cfg["live_fraction"]))
    torch.empty(1, device="cuda")  # CUDA context and allocator ready before the clock starts
    torch.cuda.synchronize()
    before = int_fields(vt.stats()) if vt else dict(torch.cuda.memory_stats())

    def alloc(n: int) -> Any:
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        if cfg["touch"]:
            t.fill_(1)
        return t

    res = replay(ops, alloc, lambda t: None, is_oom, torch.cuda.synchronize)  # dropping the reference frees it
    if vt:
        res["stats_delta"] = delta(int_fields(vt.stats()), before)
        res["peak_bytes"] = vt.stats().peak_mapped_bytes
        served = {"num_allocs": res["stats_delta"].get("num_allocs", 0)}
    else:
        after = torch.cuda.memory_stats()
        keys = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams",
                "allocation.all.allocated")
        res["stats_delta"] = {k: after.get(k, 0) - before.get(k, 0) for k in keys}
        res["peak_bytes"] = torch.cuda.max_memory_reserved()
        served = {"num_allocs": res["stats_delta"]["allocation.all.allocated"]}
    # the allocator named served every allocation that succeeded: vtalloc's counters (enable() took
    # torch's allocations) or torch's own, with PYTORCH_CUDA_ALLOC_CONF as the name says
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    res["path_check"] = check(f"churn {name}", f"{name} allocator",
                              {"num_allocs": {"min": res["allocs"]},
                               "expandable_segments": name == "expandable"},
                              {**served, "expandable_segments": "expandable_segments:True" in conf})
    gpu = {"name": props.name, "total_memory_bytes": props.total_memory, "cuda": torch.version.cuda, "torch": torch.__version__}
    return {"config": name, "status": "ok", "cap_bytes": cap, "gpu": gpu, **res}


def run_gpu_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if cfg["config"] == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True,
                           env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"config": cfg["config"], "status": "timeout"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        return {"config": cfg["config"], "status": "error", "returncode": p.returncode, "error": "\n".join(lines[-5:])}


# -- host backend: vtalloc's AddressSpace, no torch ---------------------------------------------------

def host_run(cfg: dict[str, Any]) -> dict[str, Any]:
    from vtalloc.allocator import AddressSpace

    cap = resolve_cap(cfg["cap"], None)
    ops = churn_ops(cfg["seed"], cfg["ops"], cfg["min_bytes"], cfg["max_bytes"], int(cap * cfg["live_fraction"]))
    with AddressSpace(backend="host", capacity=cap, **cfg["space_options"]) as space:
        before = int_fields(space.stats())
        modeled0 = space.modeled_ns() if space.config.cost_model else None
        res = replay(ops, space.malloc, space.free, is_oom)
        after = space.stats()
        if modeled0 is not None:  # a cost model: the driver time a GPU is predicted to spend (docs/cost-model.md)
            res["modeled_s"] = round((space.modeled_ns() - modeled0) / 1e9, 6)
    res["stats_delta"] = delta(int_fields(after), before)
    res["peak_bytes"] = after.peak_mapped_bytes
    for k in ("num_map_calls", "num_unmap_calls", "num_page_reclaims", "num_extent_splits", "extent_split_pages"):
        res[k] = res["stats_delta"].get(k, 0)
    res["path_check"] = host_check(res)
    return {"config": "vtalloc_host", "status": "ok", "cap_bytes": cap, **res}


def host_check(res: dict[str, Any]) -> dict[str, Any]:
    """The host replay went through the space under its cap: the space counted exactly the
    allocations that succeeded and as many frees (everything is freed by the end), no OOM, and the
    cap was reached (cached pages were taken back: num_page_reclaims > 0), or the run measured
    plain allocation, not churn under a cap."""
    d = res["stats_delta"]
    return check("churn vtalloc_host", "vtalloc AddressSpace under its cap",
                 {"num_allocs": res["allocs"], "num_frees": res["allocs"], "num_ooms": 0, "num_page_reclaims": {"min": 1}},
                 {k: d.get(k, 0) for k in ("num_allocs", "num_frees", "num_ooms", "num_page_reclaims")})


def table(runs: list[dict[str, Any]]) -> str:
    base = next((r for r in runs if r["config"] == "native" and r.get("status") == "ok"), None)
    rows = ["| config | time (s) | µs/op | vs native | OOMs | allocs | map / unmap calls | page reclaims | extent splits |",
            "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in runs:
        if r.get("status") != "ok":
            rows.append(f"| {r['config']} | {r.get('status', '?').upper()} | | | | | | | |")
            continue
        d = r.get("stats_delta", {})
        maps = (f"{d.get('num_map_calls', 0)} / {d.get('num_unmap_calls', 0)}" if "num_map_calls" in d or
                r["config"].startswith("vtalloc") else f"{d.get('num_device_alloc', 0)} / {d.get('num_device_free', 0)} (torch)")
        ratio = f"{r['time_s'] / base['time_s']:.2f}" if base else ""
        rows.append(f"| {r['config']} | {r['time_s']:.3f} | {r['us_per_op']:.1f} | {ratio} | {r['ooms']} | {r['allocs']} | "
                    f"{maps} | {d.get('num_page_reclaims', '')} | "
                    f"{d.get('num_extent_splits', 0) if r['config'].startswith('vtalloc') else ''} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--backend", choices=["cuda", "host"], default="cuda")
    ap.add_argument("--configs", default=",".join(GPU_CONFIGS), help="GPU: comma-separated subset")
    ap.add_argument("--cap", default=None, help="bytes ('64GiB') or percent of the device ('90%%'); GPU 90%%, host 512MiB")
    ap.add_argument("--live-fraction", type=float, default=0.9, help="most live bytes (page-rounded), x cap")
    ap.add_argument("--min-size", default="1MiB")
    ap.add_argument("--max-size", default=None, help="GPU 512MiB, host 96MiB")
    ap.add_argument("--ops", type=int, default=None, help="GPU 4000, host 3000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--touch", action="store_true", help="GPU: write every tensor once (fill_)")
    ap.add_argument("--space-option", action="append", default=[], help="k=v for enable() / AddressSpace")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="benchmarks/results/churn-{backend}-{date}.json")
    ap.add_argument("--note", action="append", default=[])
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(gpu_child(json.loads(a.child))))
        return 0
    from vtalloc.allocator.config import parse_size

    host = a.backend == "host"
    cfg = {"cap": a.cap or ("512MiB" if host else "90%"), "live_fraction": a.live_fraction, "seed": a.seed,
           "min_bytes": parse_size(a.min_size, name="min-size"),
           "max_bytes": parse_size(a.max_size or ("96MiB" if host else "512MiB"), name="max-size"),
           "ops": a.ops or (3000 if host else 4000), "touch": a.touch,
           "space_options": dict(kv.split("=", 1) for kv in a.space_option)}
    if host:
        runs = [host_run(cfg)]
    else:
        runs = []
        for c in a.configs.split(","):
            r = run_gpu_child({**cfg, "config": c}, a.timeout)
            if r.get("status") == "no_cuda":
                print("cuda: not available here (use --backend host); nothing measured")
                return 0
            runs.append(r)
            print(f"  {c:12s} {r.get('status')}" + (f"  {r['time_s']:.3f} s, {r['ooms']} OOMs" if r.get("status") == "ok"
                                                   else f"  {r.get('error', '')[:200]}"), flush=True)
    from lib.provenance import git_info, machine_info

    date = _dt.date.today().isoformat()
    record = {"benchmark": "churn", "backend": a.backend,
              "provenance": {"machine": machine_info(), "git": git_info(), "date": date,
                             "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
                             "gpu": next((r["gpu"] for r in runs if "gpu" in r), None)},
              "settings": cfg, "runs": runs, "notes": a.note}
    out = Path(a.out.format(backend=a.backend, date=date))
    out.parent.mkdir(parents=True, exist_ok=True)
    checks = [r["path_check"] for r in runs if "path_check" in r]
    record["path_checked"] = summary(checks)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(table(runs))
    print(f"wrote {out}")
    vt_ooms = sum(r.get("ooms", 0) for r in runs if r["config"].startswith("vtalloc"))
    bad = [r["config"] for r in runs if r.get("status") != "ok"]
    if vt_ooms or bad:
        print(f"FAILED: vtalloc OOMs {vt_ooms}; runs that did not finish: {bad}")
        return 1
    if failed(checks):
        print("PATH CHECK FAILED: runs measured another path than they name:\n  " + "\n  ".join(failed(checks)),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
