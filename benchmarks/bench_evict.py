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

* predicted  - with ``--cost-model h100|h200`` (host backend): the eviction and restore rates the
  driver cost model (docs/cost-model.md) predicts for each configuration measured on that GPU
  (lib/measured_rates.py), beside the measured figures and the relative error. Predictions, not
  measurements.

Run from the repository root:  python benchmarks/bench_evict.py [--quick] [--backend host|cuda]
                               python benchmarks/bench_evict.py --backend host --cost-model h100|h200
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

from lib.path_check import PathNotTaken, check, failed, summary
from lib.measured_rates import fitted_to, measured_rows, measured_source, pinned_gbps
from lib.pinned_copy import pinned_copy_times
from lib.provenance import git_info, machine_info
from vtalloc.allocator import AddressSpace, backend_available

MiB = 1 << 20
GiB = 1 << 30
REPO = Path(__file__).resolve().parent.parent


def provenance() -> dict[str, Any]:
    return {"machine": machine_info(), "git": git_info(), "date": _dt.date.today().isoformat(),
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])}


def median_s(samples: list[float]) -> float:
    return statistics.median(samples)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


# -- bandwidth -------------------------------------------------------------------------------
def evict_restore_cycles(space: AddressSpace, a: int, repeats: int, clock) -> tuple[list[float], list[float]]:
    """Seconds by `clock` of `repeats` cycles: offload + synchronize (evict), ensure_resident
    (restore)."""
    evict, restore = [], []
    for _ in range(repeats):
        t0 = clock()
        space.offload(a)
        space.synchronize()
        evict.append(clock() - t0)
        t0 = clock()
        space.ensure_resident(a)
        restore.append(clock() - t0)
    return evict, restore


def bandwidth(backend: str, size: int, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"size_bytes": size, "modes": {}}
    for mode in ("mapped", "copy", "auto"):  # "auto": the mode a default space gets (active_mode says which)
        try:
            space = AddressSpace(backend=backend, capacity=size + 8 * MiB, host_capacity=size + 8 * MiB, evict_mode=mode)
        except Exception as e:  # e.g. mapped mode unsupported on this driver
            out["modes"][mode] = {"unavailable": str(e)}
            continue
        with space:
            a = space.malloc(size)
            space.write(a, os.urandom(1 << 20) * (size // (1 << 20)))
            space.set_evictable(a)
            before = space.stats()
            evict, restore = evict_restore_cycles(space, a, repeats, time.perf_counter)
            after = space.stats()
            space.free(a)
            calls = (after.num_map_calls - before.num_map_calls) + (after.num_unmap_calls - before.num_unmap_calls)
            out["modes"][mode] = {
                "active_mode": space.evict_mode,
                # driver map + unmap calls of the timed cycles, per GiB moved (evicted + restored)
                "map_unmap_calls_per_GiB": round(calls / (2 * repeats * size / GiB), 1),
                "evict_s": evict, "restore_s": restore,
                "evict_GBps": round(gbps(size, median_s(evict)), 3),
                "restore_GBps": round(gbps(size, median_s(restore)), 3),
                "path_check": bandwidth_check(f"bandwidth {mode} {size // MiB} MiB", mode, size, repeats,
                                              space.page_bytes, space.evict_mode, before.as_dict(), after.as_dict()),
            }
    out["reference"] = reference_copy(backend, size, repeats)
    return out


def bandwidth_check(row: str, mode: str, size: int, repeats: int, page_bytes: int, active_mode: str,
                    before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Did the timed cycles move the bytes, in the mode the row names? The active mode is the one
    asked ("auto": either real mode, the one it chose); every cycle evicted and restored the whole
    allocation (bytes_evicted_total and bytes_restored_total grew by exactly repeats x size, the
    evictions and restores counters, in pages, by repeats x its pages); nothing was evicted under
    pressure."""
    d = {k: after[k] - before[k] for k in ("bytes_evicted_total", "bytes_restored_total", "evictions", "restores",
                                           "pressure_evictions")}
    expected: dict[str, Any] = {
        "active_mode": {"one_of": ["copy", "mapped"]} if mode == "auto" else mode,  # auto: the one it chose
        "bytes_evicted_total": repeats * size, "bytes_restored_total": repeats * size,
        "evictions": repeats * -(-size // page_bytes), "restores": repeats * -(-size // page_bytes),
        "pressure_evictions": 0}
    return check(row, f"evict+restore ({mode})", expected, {"active_mode": active_mode, **d})


def training_check(paged: dict[str, Any]) -> dict[str, Any]:
    """The paged_activations row paged: the pager offloaded saved tensors and the space evicted
    and restored pages (its saved activations exceed the budget, so a run that moved nothing
    measured the plain path under another name)."""
    measured = {k: paged[k] for k in ("offloads", "evictions", "restores")}
    return check("training paged_activations", "paged_activations (pages moved)",
                 {"offloads": {"min": 1}, "evictions": {"min": 1}, "restores": {"min": 1}}, measured)


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
    result = {name: {"s": t["event_s"], "GBps": round(gbps(size, median_s(t["event_s"])), 3)}
              for name, t in pinned_copy_times(size, repeats).items()}
    return {"what": "pinned cudaMemcpy through torch", **result}


# -- predicted GPU rates: the host backend under a driver cost model -------------------------
# The measured figures each model is set beside, and which of them it was fitted to:
# lib/measured_rates.py. The comparison at default settings on the H100 is BENCHMARKS.md "GPU
# figures (H100, 2026-11-26)"; on the H200, "GPU figures (H200, 2026-11-28)".
TARGET_REL_ERROR = 0.25


def predict(cost_model: str, size: int, page: int | None, mode: str, repeats: int) -> dict[str, Any]:
    """Eviction and restore of one `size` allocation on the host backend under `cost_model`,
    timed by the modeled clock (deterministic: the host's own speed does not enter). `page`:
    one handle per page (extent_size=page), as the runs before extents had; None: default settings."""
    kw: dict[str, Any] = {"page_size": page, "extent_size": page} if page else {}
    room = size + (page or 2 * MiB)
    with AddressSpace(backend="host", capacity=room, host_capacity=room, evict_mode=mode, cost_model=cost_model,
                      **kw) as space:
        a = space.malloc(size)
        space.set_evictable(a)
        evict, restore = evict_restore_cycles(space, a, repeats, lambda: space.modeled_ns() / 1e9)
        space.free(a)
    return {"evict_GBps": round(gbps(size, median_s(evict)), 2), "restore_GBps": round(gbps(size, median_s(restore)), 2),
            "evict_s": evict, "restore_s": restore}


def prediction(cost_model: str, quick: bool, repeats: int) -> dict[str, Any]:
    """The rows measured on the model's GPU beside the rates the model predicts for the same
    configuration (`quick`: allocations up to 256 MiB)."""
    rows, cache = [], {}
    for m in measured_rows(cost_model):
        if quick and m.size > 256 * MiB:
            continue
        key = (m.size, m.page, m.mode)
        if key not in cache:
            cache[key] = predict(cost_model, m.size, m.page, m.mode, repeats)
        p = cache[key]
        row: dict[str, Any] = {"size_bytes": m.size, "page_bytes": m.page, "mode": m.mode, "measured_run": m.run}
        for what, measured in (("evict", m.evict_gbps), ("restore", m.restore_gbps)):
            predicted = p[f"{what}_GBps"]
            err = predicted / measured - 1
            row[what] = {"measured_GBps": measured, "predicted_GBps": predicted, "rel_error": round(err, 3),
                         "within_target": abs(err) <= TARGET_REL_ERROR,
                         "fitted_parameter": fitted_to(cost_model, m, what)}
        rows.append(row)
    return {"cost_model": cost_model, "target_rel_error": TARGET_REL_ERROR, "modeled_repeats": repeats,
            "measured_source": measured_source(cost_model),
            "rows": rows}


SWEEP_PAGES = (2 * MiB, 8 * MiB, 32 * MiB, 64 * MiB, 128 * MiB, 256 * MiB)


def modeled_cycle(cost_model: str, mode: str, size: int, repeats: int, **space_kw: Any) -> dict[str, Any]:
    """One `size` allocation evicted and restored `repeats` times under the cost model: rates by
    the modeled clock, % of pinned, and the driver calls of one cycle (the space's counters)."""
    page = space_kw.get("page_size") or 2 * MiB
    with AddressSpace(backend="host", capacity=size + page, host_capacity=size + page, evict_mode=mode,
                      cost_model=cost_model, **space_kw) as space:
        a = space.malloc(size)
        space.set_evictable(a)
        before = space.stats().driver_calls()
        evict, restore = evict_restore_cycles(space, a, repeats, lambda: space.modeled_ns() / 1e9)
        after = space.stats().driver_calls()
        space.free(a)
    calls = {k: (after[k] - before[k]) // repeats for k in ("map", "unmap", "set_access")}
    ev, re = gbps(size, median_s(evict)), gbps(size, median_s(restore))
    pinned = pinned_gbps(cost_model)
    return {"mode": mode, "evict_GBps": round(ev, 2), "restore_GBps": round(re, 2),
            "evict_pct_of_pinned": round(100 * ev / pinned["d2h"]),
            "restore_pct_of_pinned": round(100 * re / pinned["h2d"]), "calls_per_cycle": calls}


def handle_sweep(cost_model: str, size: int, repeats: int) -> list[dict[str, Any]]:
    """What the physical handle size buys: one `size` allocation evicted and restored with each
    page size of SWEEP_PAGES (one handle per page: extent_size = page), both modes."""
    return [{"page_bytes": page, **modeled_cycle(cost_model, mode, size, repeats, page_size=page, extent_size=page)}
            for mode in ("copy", "mapped") for page in SWEEP_PAGES]


DEFAULT_SIZES = (32 * MiB, 256 * MiB, 1024 * MiB)


def default_settings(cost_model: str, sizes: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    """Eviction and restore at default settings (2 MiB pages, extents on) for each of `sizes`,
    both modes."""
    return [{"size_bytes": size, **modeled_cycle(cost_model, mode, size, repeats)}
            for mode in ("copy", "mapped") for size in sizes]


def print_defaults(rows: list[dict[str, Any]]) -> None:
    print("PREDICTED (cost model): default settings (2 MiB pages, extents), one allocation evicted + restored")
    print_rows(rows, "size_bytes", "size")


def print_rows(rows: list[dict[str, Any]], key: str, label: str) -> None:
    print(f"{'mode':6} {label:>8} | {'evict GB/s':>10} {'%pin':>5} | {'restore GB/s':>12} {'%pin':>5} | "
          f"{'map':>5} {'unmap':>5} {'access':>6}  per cycle")
    for r in rows:
        c = r["calls_per_cycle"]
        print(f"{r['mode']:6} {r[key] // MiB:>5} MiB | {r['evict_GBps']:>10} {r['evict_pct_of_pinned']:>4}% | "
              f"{r['restore_GBps']:>12} {r['restore_pct_of_pinned']:>4}% | {c['map']:>5} "
              f"{c['unmap']:>5} {c['set_access']:>6}")


def print_sweep(rows: list[dict[str, Any]], size: int) -> None:
    print(f"PREDICTED (cost model): one {size // MiB} MiB allocation, evict + restore per page (handle) size")
    print_rows(rows, "page_bytes", "page")


def print_prediction(pred: dict[str, Any]) -> None:
    print(f"PREDICTED by the host backend's cost model {pred['cost_model']!r} vs {pred['measured_source']}")
    print(f"{'size':>6} {'page':>5} {'mode':6} {'run':>3} | {'evict meas':>10} {'pred':>6} {'err':>6} | "
          f"{'restore meas':>12} {'pred':>6} {'err':>6}")
    for r in pred["rows"]:
        cells = []
        for what in ("evict", "restore"):
            c = r[what]
            mark = "*" if c["fitted_parameter"] else ("" if c["within_target"] else " !")
            cells.append(f"{c['measured_GBps']:>{10 if what == 'evict' else 12}.1f} {c['predicted_GBps']:>6.1f} "
                         f"{c['rel_error'] * 100:>+5.0f}%{mark}")
        page = f"{r['page_bytes'] // MiB:>3}Mi" if r["page_bytes"] else "  def"
        print(f"{r['size_bytes'] // MiB:>4}Mi {page} {r['mode']:6} {r['measured_run']:>3} | "
              + " | ".join(cells))
    print(f"GB/s; * = a parameter of the model was fitted to this figure; ! = beyond "
          f"{pred['target_rel_error']:.0%}")


# -- training --------------------------------------------------------------------------------
def training(steps: int, width: int, depth: int, batch: int, capacity: int, budget: int, threads: int) -> dict[str, Any]:
    """Plain vs paged_activations vs save_on_cpu, interleaved step by step (round robin after an
    untimed warm-up round, which is also paged_activations' recording iteration) so the three
    see the same machine conditions; medians of the timed rounds."""
    import torch

    from vtalloc.allocator.torch import paged_activations

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)],
                                torch.nn.Linear(width, 1))
    x, y = torch.randn(batch, width), torch.randn(batch, 1)

    saved = 0

    def count(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        torch.nn.functional.mse_loss(model(x), y).backward()

    def step(ctx) -> tuple[float, float]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with ctx:
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return time.perf_counter() - t0, loss.item()

    results: dict[str, Any] = {"saved_activation_bytes_per_step": saved, "capacity_bytes": capacity, "budget_bytes": budget,
                               "timed_rounds": steps, "torch_threads": threads,
                               "model": f"MLP width {width} depth {depth} batch {batch}"}
    with AddressSpace(backend="host", capacity=capacity, host_capacity=8 * saved) as space:
        pager = paged_activations(space, budget=budget)
        configs = {
            "plain": contextlib.nullcontext,
            "paged_activations": lambda: pager,
            "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=False),
        }
        times: dict[str, list[float]] = {k: [] for k in configs}
        losses: dict[str, list[float]] = {k: [] for k in configs}
        for rnd in range(steps + 1):
            for name, make in configs.items():
                t, loss = step(make())
                if rnd:  # round 0 warms up (and is paged_activations' recording iteration)
                    times[name].append(t)
                    losses[name].append(loss)
        st, ps = space.stats(), pager.stats()
    for name in configs:
        results[name] = {"median_step_s": median_s(times[name]), "step_s": times[name]}
        if name != "plain":
            results[name]["losses_equal_plain"] = losses[name] == losses["plain"]
            results[name]["slowdown_vs_plain"] = round(median_s(times[name]) / median_s(times["plain"]), 3)
    results["paged_activations"].update({
        "evictions": st.evictions, "restores": st.restores, "peak_mapped_bytes": st.peak_mapped_bytes,
        "offloads": ps.offloads, "prefetches": ps.prefetches, "on_demand": ps.on_demand,
        "unpack_wait_s": ps.unpack_wait_s,
    })
    results["paged_activations"]["path_check"] = training_check(results["paged_activations"])
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="host", choices=["host", "cuda"])
    ap.add_argument("--size", default=256 * MiB, type=int, help="bytes per eviction (bandwidth part)")
    ap.add_argument("--repeats", default=7, type=int)
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--out", default="benchmarks/results/evict-{backend}-{date}.json")
    ap.add_argument("--threads", default=1, type=int, help="torch CPU threads for the training part (1: least noise)")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--cost-model", choices=["h100", "h200"], default=None,
                    help="host backend only: predict the GPU's eviction rates from the driver cost model's "
                         "modeled clock, beside the rates measured on that GPU (--quick: allocations up to "
                         "256 MiB only)")
    ap.add_argument("--handle-sweep", action="store_true",
                    help="with --cost-model: predict evict/restore of one --size allocation for page (handle) "
                         "sizes 2..256 MiB, with the driver calls per cycle")
    args = ap.parse_args()
    if args.handle_sweep:
        if not args.cost_model or args.backend != "host":
            ap.error("--handle-sweep needs --backend host --cost-model NAME")
        rows = handle_sweep(args.cost_model, args.size, 1 if args.quick else 3)
        record = {"benchmark": "evict-handle-sweep-predicted", "backend": "host", "cost_model": args.cost_model,
                  "size_bytes": args.size, "provenance": provenance(), "notes": args.note, "rows": rows}
        out = Path(args.out.format(backend=f"host-{args.cost_model}-sweep", date=_dt.date.today().isoformat()))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        print_sweep(rows, args.size)
        print(f"wrote {out}")
        return
    if args.cost_model:
        if args.backend != "host":
            ap.error("--cost-model runs on the host backend (--backend host)")
        repeats = 1 if args.quick else 3
        record = {"benchmark": "evict-predicted", "backend": "host", "provenance": provenance(), "notes": args.note,
                  "prediction": prediction(args.cost_model, args.quick, repeats),
                  "default_settings": default_settings(args.cost_model, DEFAULT_SIZES[:2] if args.quick
                                                       else DEFAULT_SIZES, repeats)}
        out = Path(args.out.format(backend=f"host-{args.cost_model}-model", date=_dt.date.today().isoformat()))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        print_prediction(record["prediction"])
        print()
        print_defaults(record["default_settings"])
        print(f"wrote {out}")
        return
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
        record["training"] = training(steps=3 if args.quick else 15, width=512, depth=8,
                                      batch=256 if args.quick else 1024, capacity=16 * MiB, budget=8 * MiB,
                                      threads=args.threads)
    checks = [r["path_check"] for r in record["bandwidth"]["modes"].values() if "path_check" in r]
    if "training" in record:
        checks.append(record["training"]["paged_activations"]["path_check"])
    record["path_checked"] = summary(checks)
    out = Path(args.out.format(backend=args.backend, date=_dt.date.today().isoformat()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    bw = record["bandwidth"]
    print(f"size {size // MiB} MiB, median of {repeats}")
    for mode, r in bw["modes"].items():
        if "unavailable" in r:
            print(f"  {mode:6s}: unavailable: {r['unavailable']}")
        else:
            print(f"  {mode:6s}: evict {r['evict_GBps']:.2f} GB/s, restore {r['restore_GBps']:.2f} GB/s "
                  f"({r['active_mode']}; {r['map_unmap_calls_per_GiB']:g} map+unmap calls per GiB)")
    ref = bw["reference"]
    print(f"  reference ({ref['what']}): " + (f"{ref['GBps']:.2f} GB/s" if "GBps" in ref else
                                               f"h2d {ref['h2d']['GBps']:.2f} GB/s, d2h {ref['d2h']['GBps']:.2f} GB/s"))
    if "training" in record:
        t = record["training"]
        print(f"training ({t['model']}; {t['saved_activation_bytes_per_step'] / MiB:.0f} MiB saved per step, "
              f"space {t['capacity_bytes'] // MiB} MiB, budget {t['budget_bytes'] // MiB} MiB; "
              f"{t['timed_rounds']} interleaved rounds, {t['torch_threads']} torch thread(s)):")
        for k in ("plain", "paged_activations", "save_on_cpu"):
            r = t[k]
            extra = f", x{r['slowdown_vs_plain']} vs plain, losses equal: {r['losses_equal_plain']}" if k != "plain" else ""
            print(f"  {k:18s} {r['median_step_s'] * 1e3:8.1f} ms/step{extra}")
    print(f"wrote {out}")
    if failed(checks):  # after the JSON is written: the record shows what was measured instead
        raise PathNotTaken("bench_evict: rows measured another path than they name (figures not comparable):\n  "
                           + "\n  ".join(failed(checks)))


if __name__ == "__main__":
    main()
