"""What paged_activations adds to a CPU training step, recorded iteration and later ones apart.

Owns: the pager-overhead benchmark: for models of bench_offload_training.py at its
``--budget-fraction`` budget, step times of ``native`` (no hooks), ``vtalloc_off`` (keep or
page) and ``vtalloc`` (keep, page or recompute), each run in its own child process by
bench_offload_training.py's child (the same build, data, budget and space), repeated
``--repeats`` times with the configurations interleaved so that a change of the machine's load
touches them alike; the first step (the recorded iteration) is reported apart from the later
ones. ``--compare-tree DIR`` runs the same children a second time against another vtalloc
source tree (``DIR/vtalloc/allocator/...``, with its core library), interleaved too: a before /
after comparison in one invocation.
Invariants: every figure is a median over the timed steps of one child, then the median and
range over repeats; nothing is measured that is not written to the JSON; on a loaded machine
the figures are indicative (stated in the JSON's ``note``).

    python benchmarks/bench_pager_overhead.py --models tiny_transformer,gpt2 --repeats 5 --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib.provenance import git_info, machine_info  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIGS = ["native", "vtalloc_off", "vtalloc"]


def run(cfg: dict[str, Any], tree: str | None, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), tree, env.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, str(HERE / "bench_offload_training.py"), "--child", json.dumps(cfg)],
                       capture_output=True, text=True, env=env, timeout=timeout, cwd=tree or None)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"status": "error", "error": "\n".join(p.stderr.splitlines()[-5:])}


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="tiny_transformer,gpt2")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8, help="steps per child, the first is the recorded one")
    ap.add_argument("--warmup", type=int, default=2, help="steps before the timed ones (the recorded one among them)")
    ap.add_argument("--budget-fraction", type=float, default=0.25)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--compare-tree", default=None, help="another vtalloc tree to run the same children against")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    trees = {"this tree": None, **({"compare tree": os.path.abspath(a.compare_tree)} if a.compare_tree else {})}
    base = {"device": "cpu", "cap": "4MiB", "steps": a.steps, "warmup": a.warmup, "budget": None,
            "vtalloc_options": {"page_size": "256KiB", "host_granularity": "256KiB"}, "deterministic": False,
            "offload_min_bytes": 64 * 1024, "budget_fraction": a.budget_fraction, "max_recompute_fraction": None}
    t0 = time.time()
    samples: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for rep in range(a.repeats):
        for m in a.models.split(","):
            for c in a.configs.split(","):
                for label, tree in trees.items():
                    r = run({**base, "config": c, "model": m, "batch": a.batch}, tree, a.timeout)
                    ok = r.get("status") == "ok"
                    s = r.get("step_s", [])
                    samples.setdefault((label, m, c), []).append(
                        {"status": r.get("status"), "first_step_s": s[0] if s else None,
                         "median_later_step_s": statistics.median(s[a.warmup:]) if ok and s[a.warmup:] else None,
                         "step_s": s, "error": r.get("error")})
                    print(f"rep {rep} {label:12s} {m:16s} {c:12s} {r.get('status')} "
                          + (f"first {s[0] * 1e3:.1f} ms, later median {statistics.median(s[a.warmup:]) * 1e3:.1f} ms"
                             if ok else str(r.get("error", ""))[:200]), flush=True)
    rows = []
    for (label, m, c), xs in samples.items():
        later = [x["median_later_step_s"] for x in xs if x["median_later_step_s"] is not None]
        first = [x["first_step_s"] for x in xs if x["first_step_s"] is not None]
        rows.append({"tree": label, "model": m, "config": c, "later_steps_s": spread(later),
                     "recorded_step_s": spread(first), "runs": xs})
    for r in rows:
        nat = next((q for q in rows if (q["tree"], q["model"], q["config"]) == (r["tree"], r["model"], "native")), None)
        if nat and r["later_steps_s"] and nat["later_steps_s"]:
            r["later_over_native_s"] = r["later_steps_s"]["median"] - nat["later_steps_s"]["median"]
    print(f"| tree | model | config | later steps ms (median, min-max over {a.repeats}) | over native ms | "
          "recorded step ms (median) |\n|---|---|---|---|---:|---:|")
    for r in rows:
        ls, fs = r["later_steps_s"], r["recorded_step_s"]
        print(f"| {r['tree']} | {r['model']} | {r['config']} | "
              + (f"{ls['median'] * 1e3:.1f} ({ls['min'] * 1e3:.1f}-{ls['max'] * 1e3:.1f})" if ls else "")
              + f" | {r.get('later_over_native_s', 0) * 1e3:.1f} | " + (f"{fs['median'] * 1e3:.1f}" if fs else "") + " |")
    record = {"benchmark": "pager_overhead", "settings": {**base, "models": a.models, "configs": a.configs,
                                                         "repeats": a.repeats, "batch": a.batch, "trees": trees},
              "provenance": {"date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - t0, 1),
                             "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
                             "machine": machine_info(), "git": git_info()},
              "note": "CPU step times on a shared machine: indicative; compare configurations within one invocation",
              "rows": rows}
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(x["status"] == "ok" for xs in samples.values() for x in xs) else 1


if __name__ == "__main__":
    sys.exit(main())
