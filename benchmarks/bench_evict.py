"""bench_evict: eviction/restore bandwidth and paged training, against the physical limit
and the alternatives measured in the same run (issue 4, item 7).

Owns: the eviction benchmark and the JSON it writes. Not a test (outside ``testpaths``).

* bandwidth - one allocation of ``--size`` bytes, marked evictable: time ``offload`` +
  ``synchronize`` (evict) and ``ensure_resident`` (restore), per mode ("mapped", "copy"),
  median of ``--repeats``; beside it the physical reference measured in the same process:
  on the host backend ``memmove`` between two buffers of the same size, on cuda a pinned
  ``cudaMemcpy`` in each direction through torch (pinned tensor <-> device tensor).
* training  - steps/s of an MLP whose saved activations exceed the space's capacity:
  plain (everything in memory), ``paged_activations`` (vtalloc), and
  ``torch.autograd.graph.save_on_cpu``; losses are checked equal to the plain run. On a
  machine without CUDA this is CPU training over a host-backend space: the figures show the
  scheduler's and the copies' overhead on a CPU, not GPU behaviour.

Run from the repository root:  python benchmarks/bench_evict.py [--quick] [--backend host|cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from provenance import git_info, machine_info
from vtalloc.allocator import AddressSpace, backend_available

MiB = 1 << 20
REPO = Path(__file__).resolve().parent.parent


def provenance() -> dict[str, Any]:
    return {"machine": machine_info(), "git": git_info(), "date": _dt.date.today().isoformat(),
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])}


def median_s(samples: list[float]) -> float:
    return statistics.median(samples)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


# -- bandwidth -------------------------------------------------------------------------------
def bandwidth(backend: str, size: int, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"size_bytes": size, "modes": {}}
    for mode in ("mapped", "copy"):
        try:
            space = AddressSpace(backend=backend, capacity=size + 8 * MiB, host_capacity=size + 8 * MiB, evict_mode=mode)
        except Exception as e:  # e.g. mapped mode unsupported on this driver
            out["modes"][mode] = {"unavailable": str(e)}
            continue
        with space:
            a = space.malloc(size)
            space.write(a, os.urandom(1 << 20) * (size // (1 << 20)))
            space.set_evictable(a)
            evict, restore = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                space.offload(a)
                space.synchronize()
                evict.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                space.ensure_resident(a)
                restore.append(time.perf_counter() - t0)
            space.free(a)
            out["modes"][mode] = {
                "active_mode": space.evict_mode,
                "evict_s": evict, "restore_s": restore,
                "evict_GBps": round(gbps(size, median_s(evict)), 3),
                "restore_GBps": round(gbps(size, median_s(restore)), 3),
            }
    out["reference"] = reference_copy(backend, size, repeats)
    return out


def reference_copy(backend: str, size: int, repeats: int) -> dict[str, Any]:
    if backend == "host":
        src = ctypes.create_string_buffer(os.urandom(1 << 20) * (size // (1 << 20)), size)
        dst = ctypes.create_string_buffer(size)
        ctypes.memmove(dst, src, size)  # touch both buffers first
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ctypes.memmove(dst, src, size)
            times.append(time.perf_counter() - t0)
        return {"what": "memmove between two host buffers", "s": times, "GBps": round(gbps(size, median_s(times)), 3)}
    import torch

    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    result = {}
    for name, (dst, src) in {"h2d": (dev, host), "d2h": (host, dev)}.items():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        result[name] = {"s": times, "GBps": round(gbps(size, median_s(times)), 3)}
    return {"what": "pinned cudaMemcpy through torch", **result}


# -- training --------------------------------------------------------------------------------
def training(steps: int, width: int, depth: int, batch: int, capacity: int, budget: int) -> dict[str, Any]:
    import torch

    from vtalloc.allocator.torch import paged_activations

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)],
                                torch.nn.Linear(width, 1))
    x, y = torch.randn(batch, width), torch.randn(batch, 1)

    def run(ctx_for_step) -> tuple[list[float], list[float]]:
        losses, times = [], []
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            with ctx_for_step():
                loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        return losses, times

    saved = 0

    def count(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        torch.nn.functional.mse_loss(model(x), y).backward()

    results: dict[str, Any] = {"saved_activation_bytes_per_step": saved, "capacity_bytes": capacity, "budget_bytes": budget,
                               "steps": steps, "model": f"MLP width {width} depth {depth} batch {batch}"}
    base_losses, t_plain = run(contextlib.nullcontext)
    results["plain"] = {"median_step_s": median_s(t_plain[1:])}
    with AddressSpace(backend="host", capacity=capacity, host_capacity=8 * saved) as space:
        pager = paged_activations(space, budget=budget)
        losses, t_paged = run(lambda: pager)
        st, ps = space.stats(), pager.stats()
        results["paged_activations"] = {
            "median_step_s": median_s(t_paged[2:]),  # after the recording iteration
            "losses_equal_plain": losses == base_losses,
            "evictions": st.evictions, "restores": st.restores, "peak_mapped_bytes": st.peak_mapped_bytes,
            "offloads": ps.offloads, "prefetches": ps.prefetches, "on_demand": ps.on_demand,
            "unpack_wait_s": ps.unpack_wait_s,
        }
    losses, t_soc = run(lambda: torch.autograd.graph.save_on_cpu(pin_memory=False))
    results["save_on_cpu"] = {"median_step_s": median_s(t_soc[1:]), "losses_equal_plain": losses == base_losses}
    for k in ("paged_activations", "save_on_cpu"):
        results[k]["slowdown_vs_plain"] = round(results[k]["median_step_s"] / results["plain"]["median_step_s"], 3)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="host", choices=["host", "cuda"])
    ap.add_argument("--size", default=256 * MiB, type=int, help="bytes per eviction (bandwidth part)")
    ap.add_argument("--repeats", default=7, type=int)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--out", default="benchmarks/results/evict-{backend}-{date}.json")
    ap.add_argument("--note", action="append", default=[])
    args = ap.parse_args()
    if args.backend == "cuda":
        ok, why = backend_available("cuda")
        if not ok:
            print(f"cuda: not available here: {why}")
            sys.exit(0)
    size = 32 * MiB if args.quick else args.size
    repeats = 3 if args.quick else args.repeats
    record: dict[str, Any] = {"benchmark": "evict", "backend": args.backend, "provenance": provenance(), "notes": args.note}
    record["bandwidth"] = bandwidth(args.backend, size, repeats)
    if args.backend == "host":
        record["training"] = training(steps=4 if args.quick else 8, width=512, depth=8, batch=1024 if not args.quick else 256,
                                      capacity=16 * MiB, budget=8 * MiB)
    out = Path(args.out.format(backend=args.backend, date=_dt.date.today().isoformat()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    bw = record["bandwidth"]
    print(f"size {size // MiB} MiB, median of {repeats}")
    for mode, r in bw["modes"].items():
        if "unavailable" in r:
            print(f"  {mode:6s}: unavailable: {r['unavailable']}")
        else:
            print(f"  {mode:6s}: evict {r['evict_GBps']:.2f} GB/s, restore {r['restore_GBps']:.2f} GB/s")
    ref = bw["reference"]
    print(f"  reference ({ref['what']}): " + (f"{ref['GBps']:.2f} GB/s" if "GBps" in ref else
                                               f"h2d {ref['h2d']['GBps']:.2f} GB/s, d2h {ref['d2h']['GBps']:.2f} GB/s"))
    if "training" in record:
        t = record["training"]
        print(f"training ({t['model']}; {t['saved_activation_bytes_per_step'] / MiB:.0f} MiB saved per step, "
              f"space {t['capacity_bytes'] // MiB} MiB, budget {t['budget_bytes'] // MiB} MiB):")
        for k in ("plain", "paged_activations", "save_on_cpu"):
            r = t[k]
            extra = f", x{r['slowdown_vs_plain']} vs plain, losses equal: {r['losses_equal_plain']}" if k != "plain" else ""
            print(f"  {k:18s} {r['median_step_s'] * 1e3:8.1f} ms/step{extra}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
