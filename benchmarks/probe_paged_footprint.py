"""What paged_activations keeps in memory during a forward pass, sampled at every saved tensor.

Owns: the footprint probe for ``paged_activations`` on CPU: for one model of
bench_offload_training.py and one byte budget, the bytes the plan keeps outside the space
(``step_kept_bytes``) plus the space's mapped bytes, read after every pack of every step, and
the maximum of their sum. The two peak at different moments (the space's early in the
forward, before the newest tensors are kept; the kept bytes at its end), so adding the two
peaks overstates what is held at once; this probe reads the sum at each pack.
Invariants: the same model, data, budget and space as bench_offload_training.py's
``--budget-fraction`` runs (lib/training_models.py's functions are used, not copied); the space is trimmed before
each step; the pack hook is wrapped, never changed; JSON with provenance to ``--out``; each
step checks that it measured paging (the wrapped hook sampled, the pager offloaded in that step:
``path_check``, ``path_checked``), and a step that did not makes the probe exit 1.

    python benchmarks/probe_paged_footprint.py --model gpt2 --recompute off --out F.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import training_models as training  # noqa: E402
from lib.path_check import check, failed, summary  # noqa: E402
from lib.provenance import git_info, machine_info  # noqa: E402

MiB = 1 << 20


def probe(model: str, budget_fraction: float, recompute: str, steps: int, batch: int) -> dict[str, Any]:
    import torch

    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.torch import paged_activations

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    net, x, y, loss_fn = training.build(torch, model, batch, "cpu")
    net.train()
    fwd = training.measure_forward(torch, net, x)
    budget = max(int(fwd["saved_bytes"] * budget_fraction), 1)
    cap = 2 * fwd["saved_bytes"] + 16 * MiB
    rows = []
    with AddressSpace(backend="host", capacity=cap, host_capacity="1GiB", page_size="256KiB",
                      host_granularity="256KiB") as space:
        pager = paged_activations(space, budget=budget, recompute=recompute)
        pack = pager._pack
        for step in range(steps):
            space.trim()
            space.reset_peak_stats()
            worst = {"sum": 0, "mapped": 0, "kept": 0, "samples": 0}

            def sampled(t: Any, worst: dict = worst, pager: Any = pager) -> Any:
                out = pack(t)
                worst["samples"] += 1
                mapped = space.stats().mapped_bytes
                kept = pager.stats().step_kept_bytes
                if mapped + kept > worst["sum"]:
                    worst.update(sum=mapped + kept, mapped=mapped, kept=kept)
                return out

            pager._pack = sampled
            with pager:
                loss = loss_fn(net(x), y)
            pager._pack = pack
            st = pager.stats()
            offloads_before = rows[-1]["offloads_total"] if rows else 0
            rows.append({"step": step, "peak_kept_plus_mapped": worst["sum"], "mapped_then": worst["mapped"],
                         "kept_then": worst["kept"], "fwd_peak_mapped": space.stats().peak_mapped_bytes,
                         "kept_at_end": st.step_kept_bytes, "releases": st.releases,
                         "release_waits": st.release_waits, "samples": worst["samples"],
                         "offloads_total": st.offloads})
            rows[-1]["path_check"] = check(f"{model} step {step}", "paged_activations paging, sampled at each pack",
                                           {"samples": {"min": 1}, "offloads": {"min": 1}},
                                           {"samples": worst["samples"], "offloads": st.offloads - offloads_before})
            loss.backward()
            del loss
        del pager
    return {"model": model, "recompute": recompute, "budget_bytes": budget, "saved_bytes": fwd["saved_bytes"],
            "steps": rows, "path_checked": summary(r["path_check"] for r in rows)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2", help="a CPU model of bench_offload_training.py (gpt2, llama, cnn, ...)")
    p.add_argument("--budget-fraction", type=float, default=0.25)
    p.add_argument("--recompute", choices=("off", "auto"), default="off")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    rec = probe(a.model, a.budget_fraction, a.recompute, a.steps, a.batch)
    rec["provenance"] = {"command": " ".join(sys.argv), "machine": machine_info(), "git": git_info()}
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    for r in rec["steps"]:
        print(f"step {r['step']}: kept+mapped peak {r['peak_kept_plus_mapped'] / MiB:.2f} MiB "
              f"({r['peak_kept_plus_mapped'] / rec['budget_bytes']:.2f}x the budget {rec['budget_bytes'] / MiB:.2f} MiB; "
              f"mapped {r['mapped_then'] / MiB:.2f} + kept {r['kept_then'] / MiB:.2f} then), "
              f"fwd peak mapped {r['fwd_peak_mapped'] / MiB:.2f}, kept at end {r['kept_at_end'] / MiB:.2f}, "
              f"releases {r['releases']} (waits {r['release_waits']})")
    bad = failed(r["path_check"] for r in rec["steps"])
    if bad:  # after the JSON is written: it shows what was measured instead
        sys.exit("PATH CHECK FAILED: steps that did not measure paging:\n  " + "\n  ".join(bad))


if __name__ == "__main__":
    main()
