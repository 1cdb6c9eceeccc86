"""saved_activation_sizes: which backing vtalloc gives each saved activation, and what moving them costs (issue 10).

Owns: recording the tensors autograd saves in one forward of bench_offload_training.py's models
(fake tensors: no activation memory; ResNet-50 from torchvision, or lib/resnet50_stand_in.py's network
where torchvision does not import), the Python copy of the core's placement rule for a fresh
allocation (a block sharing one page / one-page handles / extents, csrc/alloc/alloc_policy.cpp), a replay of paged_activations' eviction rule, and
the per-step driver calls and their modeled H100 cost for each placement. Prints a table, writes
JSON (--out).
Invariants: every figure here is computed on CPU; the only GPU figures are the H100 per-call
costs and pinned copy rates copied from docs/cost-model.md (MEASURED_* below) and the measured
training rows of BENCHMARKS.md ("History, not reproducible": no raw data in the repository), which the predictions start from and say so;
bytes by backing add up to the saved total; tests/test_saved_activation_sizes.py checks
`backing()` against a real host-backend AddressSpace.

How the sizes are obtained. The models come from lib/training_models.build() at batch 1 (real
weights, on CPU); weights, buffers and an input of the wanted batch are then turned into fake
tensors (torch._subclasses.FakeTensorMode: shapes, dtypes and strides, no storage) and one forward
runs through torch.func.functional_call under saved_tensors_hooks. The benchmark's dtype policy is
bf16 autocast on CUDA; CUDA autocast cannot run without a device, so **CPU autocast** (bf16) stands
in for it on CPU fake tensors. Where they may differ: the two autocast op lists are not identical
(both cast conv/linear/matmul to bf16; for these models the fp32 ops, layer_norm and the loss, already
get fp32 inputs); kernels choose what to save per device: attention here runs CPU flash attention
(saves q, k, v, out and a fp32 logsumexp of batch x heads x seq), which is what CUDA flash and cuDNN
attention save too, bar the philox seed and offset (under 1 KiB, left alone by the pager); batch norm
saves fp32 per-channel statistics on both. Saved tensors are deduplicated by storage: vtalloc backs
a storage with one allocation of its byte size (torch asks its allocator for storage.nbytes()).

    python benchmarks/saved_activation_sizes.py --out benchmarks/results/saved_activation_sizes-{date}.json
    python benchmarks/saved_activation_sizes.py --models cnn,tiny_transformer --batches cnn=16,tiny_transformer=8
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # resnet50_stand_in sits beside this file
from lib.resnet50_stand_in import torchvision_or_why  # noqa: E402

MiB = 1 << 20
PAGE_MIN_BYTES = 1024  # paged_activations' DEFAULT_MIN_BYTES: smaller saved tensors are left alone
EXTENT_MIN_BYTES = 32 * MiB  # kExtentMinBytes (csrc/alloc/alloc_policy.hpp)
BLOCK = 512  # kMinAlignment: every allocation is whole 512-byte blocks

# H100 (80GB HBM3), 2026-11-22, docs/cost-model.md "The figures and their source": µs per call.
MEASURED_CALL_US = {  # handle bytes -> (create, map, set_access, unmap, release)
    2 * MiB: (10.0, 2.1, 26.9, 18.2, 12.4),
    8 * MiB: (11.5, 1.9, 26.3, 16.9, 14.2),
    32 * MiB: (11.1, 1.6, 26.6, 17.1, 22.5),
    128 * MiB: (12.1, 1.6, 32.8, 18.8, 54.5),
}
CALL_COLUMN = {"create_page": 0, "map": 1, "set_access": 2, "unmap": 3, "release_page": 4}
MEASURED_PINNED_GBPS = {2 * MiB: (52.8, 51.1), 8 * MiB: (54.5, 54.2), 32 * MiB: (54.9, 54.9), 256 * MiB: (55.1, 54.8)}
# The two fitted mapped-mode parameters of docs/cost-model.md (kH100 in csrc/backend/testing/cost_model.cpp).
FITTED_D2H_TO_HOST_PAGE_FACTOR = 0.66
FITTED_HOST_PAGE_UNMAP_EXTRA_US = 36.0
# One steady-state evict + restore of one handle in mapped mode (tests/test_saved_activation_sizes.py
# counts them on a host-backend space): evict unmaps the device handle, maps the host-located page
# and sets access; restore maps and sets access on a window, then unmaps it and the host page and
# maps the device handle back with its access. One of the unmaps is of a host-located page.
MAPPED_CYCLE_CALLS = {"map": 3, "unmap": 3, "set_access": 3}

# History, not reproducible (no raw data in the repository): measured on the H100, 2026-11-22
# (BENCHMARKS.md "History, not reproducible"; 16 GiB cap, budget 6 GiB,
# mapped mode, before extents): median step seconds. Ranges are (low, high).
MEASURED_STEPS = {
    ("resnet50", 1024): {"save_on_cpu": (3.265, 3.265), "offloader": (2.750, 2.750), "page2": (8.05, 8.29),
                         "page32": (2.33, 2.44), "page64": (2.22, 2.33)},
    ("transformer", 32): {"save_on_cpu": (1.064, 1.064), "offloader": (0.931, 0.931), "page2": (2.271, 2.271),
                          "page32": (0.691, 0.691), "page64": (0.688, 0.688)},
    ("transformer", 64): {"save_on_cpu": (2.122, 2.122), "page2": (6.025, 6.025)},
}
MEASURED_BUDGET = 6 << 30


@dataclasses.dataclass(frozen=True)
class Placement:
    """What decides an allocation's backing: AddressSpace(page_size=..., extent_size=..., small_threshold=...)."""

    page_bytes: int = 2 * MiB
    extent_bytes: int = 256 * MiB  # the page size turns extents off
    small_threshold: int | None = None  # default min(1 MiB, page)

    @property
    def threshold(self) -> int:
        return self.small_threshold if self.small_threshold is not None else min(MiB, self.page_bytes)


PLACEMENTS = {
    "default": Placement(),                                   # 2 MiB pages, extents up to 256 MiB
    "page2": Placement(2 * MiB, 2 * MiB),                     # the measured 2 MiB runs: one handle per page
    "page32": Placement(32 * MiB, 32 * MiB),                  # the measured 32 MiB-page runs (before extents)
    "page64": Placement(64 * MiB, 64 * MiB),                  # the measured 64 MiB-page runs
}


@dataclasses.dataclass(frozen=True)
class Backing:
    kind: str                 # "shared" (under one page: packed with its neighbours) | "pages" | "extents"
    rounded: int              # bytes the allocation takes (whole 512-byte blocks)
    handles: tuple[int, ...]  # physical handle bytes in address order (empty for a shared block)


def backing(nbytes: int, p: Placement = Placement()) -> Backing:
    """The core's rule (AllocPolicy::request and handle_plan) for a fresh allocation of nbytes: the
    first one of an empty space, at a page boundary with nothing mapped under it. It takes whole
    512-byte blocks; the pages it covers whole are one-page handles, or extents when there are at
    least min(32 MiB, extent_size) (and two pages) of them; a page it covers only in part is a
    one-page handle that its neighbours may share. Under one page it is a block packed with its
    neighbours (handles empty: the pages they share move whole)."""
    if nbytes <= 0:
        raise ValueError("allocation size must be positive")
    page = p.page_bytes
    rounded = -(-nbytes // BLOCK) * BLOCK
    if rounded < page:
        return Backing("shared", rounded, ())
    whole, tail = divmod(rounded, page)
    max_pages = p.extent_bytes // page
    max_pages = max_pages if max_pages >= 2 else 0
    min_pages = max(2, -(-min(EXTENT_MIN_BYTES, max_pages * page) // page))
    plan: list[int] = []
    if not max_pages or whole < min_pages:
        plan = [page] * whole
    else:
        left, c = whole, max_pages
        while c >= 2:  # size classes max, max/2, ... down to two pages, largest first; one page for the rest
            while left >= c:
                plan.append(c * page)
                left -= c
            c //= 2
        plan += [page] * left
    plan += [page] * (1 if tail else 0)
    return Backing("extents" if max(plan) > page else "pages", rounded, tuple(plan))


# -- the H100 cost of moving handles (docs/cost-model.md's interpolation) ---------------------------

def _interp(table: dict[int, tuple[float, ...]], size: int, col: int) -> float:
    """Linear in log2(size) between the table's rows; the nearest row outside."""
    keys = sorted(table)
    if size <= keys[0]:
        return table[keys[0]][col]
    if size >= keys[-1]:
        return table[keys[-1]][col]
    lo = max(k for k in keys if k <= size)
    hi = min(k for k in keys if k >= size)
    if lo == hi:
        return table[lo][col]
    f = (math.log2(size) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return table[lo][col] + f * (table[hi][col] - table[lo][col])


def call_us(call: str, handle_bytes: int) -> float:
    return _interp(MEASURED_CALL_US, handle_bytes, CALL_COLUMN[call])


def cycle_driver_us(handle_bytes: int) -> float:
    """Modeled driver time of one steady-state mapped-mode evict + restore of one handle."""
    calls = sum(n * call_us(c, handle_bytes) for c, n in MAPPED_CYCLE_CALLS.items())
    return calls + FITTED_HOST_PAGE_UNMAP_EXTRA_US


def cycle_copy_us(handle_bytes: int) -> float:
    """Copy time of one handle out (into a host-located page: the fitted factor) and back, µs."""
    d2h = _interp(MEASURED_PINNED_GBPS, handle_bytes, 0) * FITTED_D2H_TO_HOST_PAGE_FACTOR
    h2d = _interp(MEASURED_PINNED_GBPS, handle_bytes, 1)
    return handle_bytes / (d2h * 1e3) + handle_bytes / (h2d * 1e3)


# -- recording what autograd saves --------------------------------------------------------------

def resnet50_source(choice: str = "auto") -> str:
    """Which ResNet-50 record_saved() runs: "torchvision X.Y" or "stand-in (...why...)". ``choice``:
    auto (torchvision where it imports), torchvision (or an error naming what to install), stand-in."""
    if choice == "stand-in":
        return "stand-in (asked for)"
    tv, why = torchvision_or_why()
    if tv is not None:
        return f"torchvision {tv.__version__}"
    if choice == "torchvision":
        raise SystemExit(f"saved_activation_sizes: ResNet-50 from torchvision, but torchvision does not import ({why});"
                         " install the torchvision built for this torch (pip install -e '.[bench]' names it), or"
                         " run with --resnet50 stand-in")
    return f"stand-in (torchvision does not import: {why})"


def record_saved(model: str, batch: int, resnet50: str = "auto") -> list[dict[str, Any]]:
    """One entry per pack, in pack order: storage key and bytes, the tensor's own bytes, and
    whether paged_activations would leave it alone (a parameter or a view of one). ResNet-50 is
    torchvision's, or the stand-in where torchvision does not import (``resnet50``: resnet50_source())."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.func import functional_call

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lib import training_models as training

    if model == "resnet50" and resnet50_source(resnet50).startswith("stand-in"):
        # training.build's ResNet-50 inputs and loss with the stand-in network (only shapes matter here)
        from lib.resnet50_stand_in import resnet50_stand_in

        torch.manual_seed(0)
        net = resnet50_stand_in(torch).to(memory_format=torch.channels_last)
        x = torch.randn((1, 3, 224, 224)).contiguous(memory_format=torch.channels_last)
        y, loss_fn = torch.randint(1000, (1,)), training.loss_fn(torch)
    else:
        net, x, y, loss_fn = training.build(torch, model, 1, "cpu")
    mode = FakeTensorMode()
    state = {k: mode.from_tensor(v) for k, v in [*net.named_parameters(), *net.named_buffers()]}
    packs: list[dict[str, Any]] = []
    keep: list[Any] = []

    def pack(t: Any) -> Any:
        base = t._base if t._base is not None else t
        st = t.untyped_storage()
        keep.append(t)  # storages stay alive (and their keys unique) for the whole forward
        packs.append({"storage": st._cdata, "storage_bytes": st.nbytes(), "tensor_bytes": t.numel() * t.element_size(),
                      "parameter": bool(base.is_leaf and base.requires_grad), "shape": list(t.shape),
                      "dtype": str(t.dtype).replace("torch.", "")})
        return t

    with mode:
        def at_batch(t: Any) -> Any:
            f = torch.empty((batch, *t.shape[1:]), dtype=t.dtype)
            return f.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and not t.is_contiguous() else f

        fx, fy = at_batch(x), at_batch(y)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
            loss_fn(functional_call(net, state, (fx,)), fy)
    keys = {}
    for p in packs:  # small stable keys instead of addresses
        p["storage"] = keys.setdefault(p["storage"], len(keys))
    return packs


def pager_evictions(packs: list[dict[str, Any]], budget: int) -> set[int]:
    """Storages that paged_activations' eviction rule offloads in one scheduled forward: every
    pack adds its storage's bytes; while they exceed the budget the oldest resident ones go."""
    entries, resident, evicted = [], 0, set()
    for p in packs:
        if p["parameter"] or p["tensor_bytes"] < PAGE_MIN_BYTES:
            continue
        entries.append([p, True])
        resident += p["storage_bytes"]
        for e in entries[:-1]:
            if resident <= budget:
                break
            if e[1]:
                e[1] = False
                resident -= e[0]["storage_bytes"]
                evicted.add(e[0]["storage"])
    return evicted


def summarize(packs: list[dict[str, Any]], budgets: list[int]) -> dict[str, Any]:
    """Bytes, counts and shares by backing per placement; handles and modeled cost of moving the
    evicted storages once out and back per step, per budget."""
    storages: dict[int, int] = {}
    for p in packs:
        if not p["parameter"] and p["tensor_bytes"] >= PAGE_MIN_BYTES:
            storages.setdefault(p["storage"], p["storage_bytes"])
    total = sum(storages.values())
    out: dict[str, Any] = {"packs": len(packs), "saved_storages": len(storages), "saved_bytes": total,
                           "left_alone_packs": sum(1 for p in packs if p["parameter"] or p["tensor_bytes"] < PAGE_MIN_BYTES),
                           "placements": {}}
    for name, pl in PLACEMENTS.items():
        backs = {k: backing(n, pl) for k, n in storages.items()}
        by_kind = {kind: {"bytes": sum(storages[k] for k, b in backs.items() if b.kind == kind),
                          "count": sum(1 for b in backs.values() if b.kind == kind),
                          "mapped_bytes": sum(b.rounded for b in backs.values() if b.kind == kind)}
                   for kind in ("extents", "pages", "shared")}
        for v in by_kind.values():
            v["share_of_bytes"] = v["bytes"] / total if total else 0.0
            v["share_of_tensors"] = v["count"] / len(storages) if storages else 0.0
        hist: dict[int, int] = {}
        for b in backs.values():
            for h in b.handles:
                hist[h] = hist.get(h, 0) + 1
        per_budget = {}
        for budget in budgets:
            moved = pager_evictions(packs, budget)
            handles = [h for k in moved for h in backs[k].handles]
            shared = sum(backs[k].rounded for k in moved if backs[k].kind == "shared")
            handles += [pl.page_bytes] * -(-shared // pl.page_bytes)  # the pages they pack into, moved whole
            driver = sum(cycle_driver_us(h) for h in handles)
            copy = sum(cycle_copy_us(h) for h in handles)
            calls = {c: n * len(handles) for c, n in MAPPED_CYCLE_CALLS.items()}
            per_budget[str(budget)] = {
                "evicted_storages": len(moved), "evicted_bytes": sum(storages[k] for k in moved),
                "handles_per_step": len(handles), "moved_bytes_per_step": 2 * sum(handles),
                "driver_calls_per_step": calls, "modeled_driver_s": driver / 1e6, "modeled_copy_s": copy / 1e6}
        out["placements"][name] = {"placement": dataclasses.asdict(pl), "by_backing": by_kind,
                                   "handles_by_size": {str(k): v for k, v in sorted(hist.items())},
                                   "per_budget": per_budget}
    return out


def modeled_s(summary: dict[str, Any], placement: str, budget: int = MEASURED_BUDGET) -> float:
    pb = summary["placements"][placement]["per_budget"][str(budget)]
    return pb["modeled_driver_s"] + pb["modeled_copy_s"]


def predict(model: str, batch: int, summary: dict[str, Any], ref: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Default-settings step time from each measured big-page run: measured step - modeled(driver +
    copy) of the measured placement + modeled(driver + copy) of the default one, at the measured
    budget. Where a batch has no big-page run, the big-page step measured at `ref` (another batch of
    the model: {"batch", "summary"}) is first scaled by the modeled paging time of the two batches
    (the big-page runs are transfer-bound: see "checks"). The 2 MiB rows are not used to predict:
    the per-call model misses a per-handle cost there ("check_page2_from_page32")."""
    meas = MEASURED_STEPS.get((model, batch))
    if meas is None:
        return None
    out: dict[str, Any] = {"budget": MEASURED_BUDGET, "measured_step_s": meas, "from": {}, "checks": {}}
    for src in ("page32", "page64"):
        if src in meas:
            lo, hi, how = *meas[src], "measured at this batch"
        elif ref is not None and src in MEASURED_STEPS.get((model, ref["batch"]), {}):
            k = modeled_s(summary, src) / modeled_s(ref["summary"], src)
            lo, hi = (k * v for v in MEASURED_STEPS[(model, ref["batch"])][src])
            how = f"measured at batch {ref['batch']} x modeled paging ratio {k:.3f}"
        else:
            continue
        adj = modeled_s(summary, "default") - modeled_s(summary, src)
        row = {"big_page_step_s": (lo, hi), "big_page_step_how": how, "adjustment_s": adj,
               "predicted_default_step_s": (lo + adj, hi + adj),
               "predicted_default_samples_per_s": (batch / (hi + adj), batch / (lo + adj))}
        for peer in ("save_on_cpu", "offloader"):
            if peer in meas:
                row[f"predicted_ratio_vs_{peer}"] = (meas[peer][0] / (hi + adj), meas[peer][0] / (lo + adj))
        out["from"][src] = row
        if src in meas:  # how much of the measured step the model accounts for
            out["checks"][f"modeled_paging_share_of_{src}_step"] = (modeled_s(summary, src) / hi,
                                                                   modeled_s(summary, src) / lo)
    if "page32" in meas and "page2" in meas:  # does the per-call model explain 2 MiB against 32 MiB?
        lo, hi = meas["page32"]
        adj = modeled_s(summary, "page2") - modeled_s(summary, "page32")
        extra = [summary["placements"][n]["per_budget"][str(MEASURED_BUDGET)]["handles_per_step"] for n in ("page2", "page32")]
        mid = (meas["page2"][0] + meas["page2"][1]) / 2 - (lo + hi) / 2 - adj
        out["checks"]["check_page2_from_page32"] = {"predicted_s": (lo + adj, hi + adj), "measured_s": meas["page2"],
                                                    "unmodeled_us_per_handle": 1e6 * mid / (extra[0] - extra[1])}
    return out


def table(results: list[dict[str, Any]], budget: int) -> str:
    rows = ["| model | batch | saved GiB | tensors | on extents: bytes / tensors | 2 MiB pages: bytes / tensors | "
            "shared: bytes / tensors | handles/step default / 32 MiB / 64 MiB / 2 MiB | driver ms/step default / 32 / 64 / 2 | "
            "copy ms/step default / 32 / 64 |",
            "|---|---:|---:|---:|---|---|---|---|---|---|"]
    for r in results:
        s, b = r["summary"], str(budget)
        k = s["placements"]["default"]["by_backing"]
        pb = {n: s["placements"][n]["per_budget"][b] for n in PLACEMENTS}
        share = lambda d: f"{100 * d['share_of_bytes']:.1f}% / {100 * d['share_of_tensors']:.1f}%"  # noqa: E731
        rows.append(
            f"| {r['model']} | {r['batch']} | {s['saved_bytes'] / (1 << 30):.2f} | {s['saved_storages']} | "
            f"{share(k['extents'])} | {share(k['pages'])} | {share(k['shared'])} | "
            + " / ".join(str(pb[n]["handles_per_step"]) for n in ("default", "page32", "page64", "page2")) + " | "
            + " / ".join(f"{1e3 * pb[n]['modeled_driver_s']:.0f}" for n in ("default", "page32", "page64", "page2")) + " | "
            + " / ".join(f"{1e3 * pb[n]['modeled_copy_s']:.0f}" for n in ("default", "page32", "page64")) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,transformer")
    ap.add_argument("--batches", default="resnet50=512/1024,transformer=32/64", help="model=b1/b2,...")
    ap.add_argument("--budgets", default="6GiB,8GiB", help="paged_activations budgets (measured runs: 6GiB; "
                                                          "default: half the 16 GiB cap)")
    ap.add_argument("--out", default=None, help="JSON path ({date} filled in)")
    ap.add_argument("--resnet50", choices=("auto", "torchvision", "stand-in"), default="auto",
                    help="ResNet-50 from torchvision, or the stand-in of lib/resnet50_stand_in.py (same layers, same order) where "
                         "torchvision does not import beside this torch; auto: torchvision if it imports")
    a = ap.parse_args(argv)
    batches = {m: [int(b) for b in bs.split("/")] for m, bs in (kv.split("=") for kv in a.batches.split(","))}
    from vtalloc.allocator.config import parse_size  # the project's one size parser

    try:
        budgets = [parse_size(s, name="budget") for s in a.budgets.split(",")]
    except ValueError as e:
        ap.error(str(e))
    if MEASURED_BUDGET not in budgets:
        budgets.insert(0, MEASURED_BUDGET)
    models = a.models.split(",")
    resnet50 = resnet50_source(a.resnet50) if "resnet50" in models else None
    if resnet50 and resnet50.startswith("stand-in"):
        print(f"ResNet-50: the {resnet50}", file=sys.stderr)
    results = []
    for m in models:
        for bsz in batches.get(m, []):
            packs = record_saved(m, bsz, a.resnet50)
            s = summarize(packs, budgets)
            results.append({"model": m, "batch": bsz, "summary": s,
                            "largest_saved": sorted({p["storage_bytes"] for p in packs if not p["parameter"]})[-5:]})
    for r in results:  # a batch without big-page runs scales from the model's batch that has them
        ref = next((q for q in results if q["model"] == r["model"] and "page32" in MEASURED_STEPS.get((q["model"], q["batch"]), {})), None)
        r["prediction"] = predict(r["model"], r["batch"], r["summary"], ref)
    from lib.provenance import git_info, machine_info

    import torch
    record = {"benchmark": "saved_activation_sizes", "predictions": True,
              "provenance": {"date": _dt.date.today().isoformat(),
                             "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
                             "machine": machine_info(), "git": git_info(), "torch": torch.__version__,
                             "resnet50": resnet50},
              "method": {"dtype_policy": "CPU autocast bf16 on FakeTensorMode CPU tensors (stands in for CUDA autocast)",
                         "mapped_cycle_calls_per_handle": MAPPED_CYCLE_CALLS,
                         "fitted": {"d2h_to_host_page_factor": FITTED_D2H_TO_HOST_PAGE_FACTOR,
                                    "host_page_unmap_extra_us": FITTED_HOST_PAGE_UNMAP_EXTRA_US}},
              "placements": {k: dataclasses.asdict(v) for k, v in PLACEMENTS.items()}, "budgets": budgets,
              "results": results}
    for budget in budgets:
        print(f"budget {budget / (1 << 30):g} GiB")
        print(table(results, budget))
    for r in results:
        if r["prediction"]:
            print(r["model"], r["batch"], json.dumps(r["prediction"]))
    if a.out:
        out = Path(a.out.format(date=record["provenance"]["date"]))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
