"""offload_report: what bench_offload_training.py's parent makes of its runs: the loss and
gradient checks, the recompute rows, the Markdown tables and the chart.

Owns: ``check_losses`` (each completed run's losses against the first in ``REFERENCE_ORDER`` at
the same model and batch), ``check_grads`` (the last step's gradients against ``native``'s, bit
for bit), ``recompute_rows`` / ``recompute_table`` (vtalloc and vtalloc_off at one budget beside
per-block checkpointing on the H100 cost model: predictions, labelled so), ``table`` and ``chart``.
Invariants: reads the runs' records (and the gradients they saved), measures nothing; a run that did
not finish is shown with its status, never with a figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lib.offload_peers import PAGER_CONFIGS, REFERENCE_ORDER

MiB = 1 << 20


def check_losses(runs: list[dict[str, Any]], rtol: float) -> list[dict[str, Any]]:
    """Per (model, batch): every completed run's losses against the first completed run in REFERENCE_ORDER."""
    checks = []
    for key in sorted({(r["model"], r["batch"]) for r in runs if r.get("status") == "ok"}, key=str):
        ok = {r["config"]: r for r in runs if (r["model"], r["batch"]) == key and r.get("status") == "ok"}
        if len(ok) < 2:
            continue
        ref = next(c for c in REFERENCE_ORDER if c in ok)
        for c, r in ok.items():
            if c == ref:
                continue
            diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["losses"], ok[ref]["losses"]))
            checks.append({"model": key[0], "batch": key[1], "config": c, "reference": ref, "max_rel_diff": diff,
                           "rtol": rtol, "equal": diff <= rtol and len(r["losses"]) == len(ok[ref]["losses"])})
    return checks


def check_grads(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, batch): the last step's gradients of every completed run against ``native``'s,
    bit for bit (same seeds, deterministic CPU kernels, one thread)."""
    import torch

    checks = []
    for r in runs:
        ref = next((q for q in runs if (q["model"], q["batch"]) == (r["model"], r["batch"]) and q["config"] == "native"
                    and q.get("status") == "ok" and q.get("grads_out")), None)
        if r is ref or ref is None or r.get("status") != "ok" or not r.get("grads_out"):
            continue
        a, b = torch.load(r["grads_out"]), torch.load(ref["grads_out"])
        same_none = len(a) == len(b) and all((g is None) == (h is None) for g, h in zip(a, b))
        pairs = [(g, h) for g, h in zip(a, b) if g is not None and h is not None]
        diff = max((float((g.double() - h.double()).abs().max()) for g, h in pairs if g.shape == h.shape), default=0.0)
        equal = same_none and all(g.shape == h.shape and g.dtype == h.dtype and torch.equal(g, h) for g, h in pairs)
        checks.append({"model": r["model"], "batch": r["batch"], "config": r["config"], "reference": "native",
                       "tensors": len(pairs), "max_abs_diff": diff, "bit_identical": equal})
        r["grads_vs_native"] = checks[-1]
    return checks


def recompute_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and batch: vtalloc (recompute="auto") and vtalloc_off at the same budget, with
    per-block checkpointing beside them in the H100 cost model: the time each adds to a step
    (the plan's modelled_s; checkpointing's recompute, counted in backward) and the modelled
    step (forward and backward of the recorded forward's modelled time, plus that). The
    recompute FLOPs (``recompute_flops_vs_forward``) are those run at unpack against the
    forward's as ``FlopCounterMode`` counts them (matmuls only: the ratio errs high); the trace
    check runs none."""
    from vtalloc.allocator.activation_costs import H100

    rows = []
    for r in runs:
        if r["config"] not in PAGER_CONFIGS or r.get("status") != "ok" or "pager_step" not in r:
            continue
        st, fwd = r["pager_step"], r.get("forward", {})
        off, ckpt = (next((q for q in runs if (q["model"], q["batch"], q["config"]) == (r["model"], r["batch"], c)
                           and q.get("status") == "ok"), None) for c in ("vtalloc_off", "checkpoint"))
        off_paged = off["pager_step"]["bytes_paged"] if off and "pager_step" in off else None
        ratio = st["bytes_paged"] / off_paged if off_paged else None
        flops_frac = st["recompute_flops"] / fwd["forward_flops"] if fwd.get("forward_flops") else None
        g = r.get("grads_vs_native", {})
        plan = r.get("plan_summary", {})
        base = (1 + H100.backward_factor) * plan["forward_s"] if plan.get("forward_s") else None
        ck = (ckpt or {}).get("modelled_recompute", {}).get("h100_s")
        row = {"model": r["model"], "batch": r["batch"], "config": r["config"], "budget_bytes": r.get("budget_bytes"),
               "saved_bytes": fwd.get("saved_bytes"), "forward_flops": fwd.get("forward_flops"), **st,
               "paged_vs_offload_only": ratio, "recompute_flops_vs_forward": flops_frac,
               "grads_bit_identical": g.get("bit_identical"), "grads_max_abs_diff": g.get("max_abs_diff"),
               "modelled_h100_s": plan.get("modelled_s"), "checkpoint_modelled_h100_s": ck,
               "modelled_step_h100_s": None if base is None else base + plan.get("modelled_s", 0.0),
               "checkpoint_modelled_step_h100_s": None if base is None or ck is None else base + ck,
               "segments": plan.get("segments"), "plan_cpu_s": plan.get("plan_s"),
               "recorded_step_s": r.get("recorded_step_s"), "median_step_s": r.get("median_step_s")}
        if r["config"] == "vtalloc":
            row["targets_met"] = {"modelled_le_checkpoint": ck is not None and plan.get("modelled_s", 1e9) <= ck,
                                  "grads_bit_identical": bool(g.get("bit_identical"))}
        rows.append(row)
    return rows


def recompute_table(rows: list[dict[str, Any]]) -> str:
    def mib(v: Any) -> str:
        return "" if v is None else f"{v / MiB:.2f}"

    def ms(v: Any) -> str:
        return "" if v is None else f"{v * 1e3:.3f}"

    out = ["| model | batch | config | saved MiB | budget MiB | kept MiB | paged MiB/step | vs off | "
           "recomputed MiB/step | recompute FLOPs / fwd | grads bit-identical (max abs diff) | "
           "modelled H100 ms added (prediction) | checkpointing's (prediction) | recorded step / later step (ms, CPU) |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for w in rows:
        ratio = "" if w["paged_vs_offload_only"] is None else f"{w['paged_vs_offload_only']:.2f}x"
        frac = "" if w["recompute_flops_vs_forward"] is None else f"{100 * w['recompute_flops_vs_forward']:.2f}%"
        steps = "" if w["recorded_step_s"] is None else f"{ms(w['recorded_step_s'])} / {ms(w['median_step_s'])}"
        out.append(f"| {w['model']} | {w['batch']} | {w['config']} | {mib(w['saved_bytes'])} | {mib(w['budget_bytes'])} | "
                   f"{mib(w['kept_bytes'])} | {mib(w['bytes_paged'])} | {ratio} | {mib(w['bytes_recomputed'])} | {frac} | "
                   f"{w['grads_bit_identical']} ({w['grads_max_abs_diff']}) | {ms(w['modelled_h100_s'])} | "
                   f"{ms(w['checkpoint_modelled_h100_s'])} | {steps} |")
    return "\n".join(out)


def table(runs: list[dict[str, Any]], checks: list[dict[str, Any]]) -> str:
    eq = {(c["model"], c["batch"], c["config"]): c for c in checks}
    rows = ["| model | batch | config | median step (s) | samples/s | peak MiB | moved MiB/step | losses |",
            "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in runs:
        c = eq.get((r["model"], r["batch"], r["config"]))
        loss = ("reference" if r.get("status") == "ok" and c is None else
                f"{'equal' if c['equal'] else 'DIFFER'} ({c['max_rel_diff']:.1e} vs {c['reference']})" if c else "")
        if r.get("status") != "ok":
            rows.append(f"| {r['model']} | {r['batch']} | {r['config']} | {r.get('status', '?').upper()} | | | | |")
            continue
        rows.append(f"| {r['model']} | {r['batch']} | {r['config']} | {r['median_step_s']:.4f} | {r['samples_per_s']:.1f} | "
                    f"{r['peak_bytes'] / MiB:.0f} | {r['bytes_moved_per_step'] / MiB:.1f} | {loss} |")
    return "\n".join(rows)


def chart(runs: list[dict[str, Any]], path: str, title: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "skipped: matplotlib is not installed"
    models = sorted({r["model"] for r in runs})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        rs = [r for r in runs if r["model"] == m]
        labels = [f"{r['config']}\nb={r['batch']}" for r in rs]
        vals = [r.get("samples_per_s", 0.0) if r.get("status") == "ok" else 0.0 for r in rs]
        bars = ax.bar(range(len(rs)), vals, color=["#888" if r["config"] in ("native", "expandable") else
                                                   "#c44" if r["config"] == "vtalloc" else "#48c" for r in rs])
        for b, r in zip(bars, rs):
            if r.get("status") != "ok":
                ax.text(b.get_x() + b.get_width() / 2, 0, r.get("status", "?").upper(), ha="center", va="bottom",
                        fontsize=7, rotation=90)
        ax.set_xticks(range(len(rs)), labels, fontsize=7, rotation=45, ha="right")
        ax.set_ylabel("samples/s")
        ax.set_title(m)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
