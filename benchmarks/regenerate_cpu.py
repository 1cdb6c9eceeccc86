"""regenerate_cpu: run every CPU-measured and cost-model-predicted command of BENCHMARKS.md at HEAD.

Owns: COMMANDS, the commands BENCHMARKS.md's **Regenerate** lines show (each entry names its
section, its command exactly as the section shows it, and a quick form of it), and running them:
in order, each writing its JSON under benchmarks/results/ with today's date in the name, stopping
at the first one that fails. A benchmark exits 1 when a row measured another path than it names
(benchmarks/lib/path_check.py); a JSON whose ``path_checked`` did not pass stops the run too.
Invariants: stdlib only, and it imports nothing of vtalloc or torch (the commands do); a command's
text is the one BENCHMARKS.md shows, with ``{date}`` (today, YYYY-MM-DD) and ``{heldout}`` (the
folder of the held-out traces) filled in when it runs, and ``python`` run as this interpreter;
an existing results file is never overwritten unless asked; --quick writes to a scratch folder,
never to benchmarks/results/. tests/test_regenerate_cpu.py checks that every section of
BENCHMARKS.md but the GPU and history ones has a Regenerate line, and that its commands are
these, in this order.

    python benchmarks/regenerate_cpu.py --dry-run                # what would run, in order
    python benchmarks/regenerate_cpu.py                          # all of it (hours, on a quiet machine)
    python benchmarks/regenerate_cpu.py --only malloc_free,evict
    python benchmarks/regenerate_cpu.py --quick                  # every command's quick form (minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "benchmarks/results/"
DEFAULT_HELDOUT = Path(tempfile.gettempdir()) / "vtalloc-heldout-traces"
HF = ("transformers",)  # the bench extra: pip install -e '.[bench]'


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a BENCHMARKS.md section's **Regenerate** line."""

    name: str                  # what --only takes
    section: str               # the heading of the BENCHMARKS.md section that shows it
    command: str               # exactly as BENCHMARKS.md shows it
    quick: str | None          # its quick form (None: not run by --quick, for the reason in skip_quick)
    needs: tuple[str, ...] = ()        # Python packages it imports beyond vtalloc and torch
    quick_needs: tuple[str, ...] = ()  # the same for the quick form
    skip_quick: str = ""


def _trace_models() -> list[tuple[str, str]]:
    """The held-out variants of the stored models (name, record_trace.py arguments)."""
    return [("resnet50_b8", "--model resnet50 --batch 8"), ("resnet50_b32", "--model resnet50 --batch 32"),
            ("vit_b16", "--model vit --batch 16"), ("gpt2_b4", "--model gpt2 --batch 4"),
            ("bert_b16_s256", "--model bert --batch 16 --seq-len 256"),
            ("llama_b4_s256", "--model llama --batch 4 --seq-len 256"), ("t5_b16", "--model t5 --batch 16"),
            ("swin_b8", "--model swin --batch 8"), ("convnext_b8", "--model convnext --batch 8")]


MALLOC = "malloc/free"
FREE_EVICTABLE = "free under an evictable allocation"
EVICT = "Eviction and paged training"
OFFLOAD = "Offload training against every peer"
RECOMPUTE = "Keep, page out or recompute under one byte budget (CPU)"
SEGMENTS = "Segments against checkpointing (CPU; H100 modelled and predicted)"
ATTACK = "The daemon under attack: another user's lease latency (host backend)"
CHURN = "Churn: random-size tensors under a cap"
EVICT_MODEL = "Predicted (host cost model): eviction on an H100"
EVICT_MODEL_H200 = "Predicted (host cost model): eviction on an H200, refit to its runs"
SIZES = "Predicted: in-place paged training at default settings"
TRACES = "Memory on real models' allocation traces"
HELDOUT = "The same bounds on models that are not in the repo"
SIM = "Beside PyTorch's allocator, simulated"
SAVED = "Saved activations offloaded from shared pages"
REGIONS = "Regions: pause and resume (host backend; predicted on an H100)"

_SMOKE_RECOMPUTE = ("python benchmarks/bench_offload_training.py --cpu-smoke --models cnn "
                    "--configs native,vtalloc_off,vtalloc --budget-fraction 0.25 --steps 2 --warmup 1 --multiples 1")
_SMALL_CHURN = "python benchmarks/bench_churn.py --backend host --ops 300 --cap 64MiB --max-size 16MiB"

COMMANDS: tuple[Command, ...] = (
    Command("malloc_free", MALLOC,
            "python benchmarks/bench_malloc_free.py --backend host --out benchmarks/results/malloc_free-host-{date}.json",
            "python benchmarks/bench_malloc_free.py --backend host --quick "
            "--out benchmarks/results/malloc_free-host-{date}.json"),
    Command("free_evictable", FREE_EVICTABLE,
            "python benchmarks/bench_free_evictable.py --out benchmarks/results/free_evictable-host-{date}.json",
            "python benchmarks/bench_free_evictable.py --quick --out benchmarks/results/free_evictable-host-{date}.json"),
    Command("evict", EVICT,
            "python benchmarks/bench_evict.py --out benchmarks/results/evict-host-{date}.json",
            "python benchmarks/bench_evict.py --quick --out benchmarks/results/evict-host-{date}.json"),
    Command("offload_smoke", OFFLOAD,
            "python benchmarks/bench_offload_training.py --cpu-smoke --chart benchmarks/results/offload_training-cpu-{date}.png "
            "--out benchmarks/results/offload_training-cpu-{date}.json",
            "python benchmarks/bench_offload_training.py --cpu-smoke --models cnn --configs native,vtalloc --steps 2 "
            "--warmup 1 --out benchmarks/results/offload_training-cpu-{date}.json"),
    Command("recompute", RECOMPUTE,
            "python benchmarks/bench_offload_training.py --cpu-smoke --models cnn,tiny_transformer,gpt2,llama "
            "--configs native,checkpoint,vtalloc_off,vtalloc --budget-fraction 0.25 --steps 4 --warmup 2 --multiples 1 "
            "--out benchmarks/results/offload_training-recompute-cpu-{date}.json",
            _SMOKE_RECOMPUTE + " --out benchmarks/results/offload_training-recompute-cpu-{date}.json", needs=HF),
    Command("recompute_resnet50", RECOMPUTE,
            "python benchmarks/bench_offload_training.py --cpu-smoke --models resnet50 "
            "--configs native,checkpoint,vtalloc_off,vtalloc --budget-fraction 0.25 --steps 4 --warmup 2 --multiples 1 "
            "--batch resnet50=2 --out benchmarks/results/offload_training-recompute-resnet50-cpu-{date}.json",
            None, skip_quick="ResNet-50 at 224x224 takes seconds per step on 2 cores; the CNN of the quick "
            "recompute form covers the same code"),
    Command("footprint_off", RECOMPUTE,
            "python benchmarks/probe_paged_footprint.py --model gpt2 --recompute off "
            "--out benchmarks/results/paged_footprint-gpt2-off-cpu-{date}.json",
            "python benchmarks/probe_paged_footprint.py --model cnn --steps 2 --recompute off "
            "--out benchmarks/results/paged_footprint-gpt2-off-cpu-{date}.json", needs=HF),
    Command("footprint_auto", RECOMPUTE,
            "python benchmarks/probe_paged_footprint.py --model gpt2 --recompute auto "
            "--out benchmarks/results/paged_footprint-gpt2-auto-cpu-{date}.json",
            "python benchmarks/probe_paged_footprint.py --model cnn --steps 2 --recompute auto "
            "--out benchmarks/results/paged_footprint-gpt2-auto-cpu-{date}.json", needs=HF),
    Command("recompute_cap1", RECOMPUTE,
            "python benchmarks/bench_offload_training.py --cpu-smoke --models cnn,tiny_transformer,gpt2,llama "
            "--configs native,checkpoint,vtalloc_off,vtalloc --budget-fraction 0.25 --steps 4 --warmup 2 --multiples 1 "
            "--max-recompute-fraction 1.0 --out benchmarks/results/offload_training-recompute-cap1-cpu-{date}.json",
            _SMOKE_RECOMPUTE + " --max-recompute-fraction 1.0 "
            "--out benchmarks/results/offload_training-recompute-cap1-cpu-{date}.json", needs=HF),
    Command("segments", SEGMENTS,
            "python benchmarks/bench_offload_training.py --cpu-smoke --models tiny_transformer,gpt2,llama,resnet50 "
            "--configs native,checkpoint,vtalloc_off,vtalloc --budget-fraction 0.25 --steps 4 --warmup 2 --multiples 1 "
            "--batch resnet50=2 --out benchmarks/results/offload_training-segments-cpu-{date}.json",
            "python benchmarks/bench_offload_training.py --cpu-smoke --models tiny_transformer "
            "--configs native,checkpoint,vtalloc --budget-fraction 0.25 --steps 3 --warmup 2 --multiples 1 "
            "--out benchmarks/results/offload_training-segments-cpu-{date}.json", needs=HF),
    Command("check_overhead", SEGMENTS,
            "python benchmarks/bench_check_overhead.py --out benchmarks/results/check_overhead-cpu-{date}.json",
            "python benchmarks/bench_check_overhead.py --models tiny_transformer --repeats 10 --steps 3 "
            "--out benchmarks/results/check_overhead-cpu-{date}.json", needs=HF, quick_needs=HF),
    Command("predict_transformer", SEGMENTS,
            "python benchmarks/predict_gpu_plan.py --model transformer "
            "--out benchmarks/results/predicted_transformer_4x-h100-{date}.json",
            None, skip_quick="records the 2048-wide transformer twice on CPU (minutes, several GiB)"),
    Command("predict_resnet50", SEGMENTS,
            "python benchmarks/predict_gpu_plan.py --model resnet50 "
            "--out benchmarks/results/predicted_resnet50_4x-h100-{date}.json",
            None, skip_quick="records ResNet-50 twice on CPU (minutes)"),
    Command("attack_latency", ATTACK,
            "python benchmarks/bench_attack_latency.py --out benchmarks/results/attack-latency-{date}.json",
            "python benchmarks/bench_attack_latency.py --only hello_storm --windows 1 --window 0.5 --seconds 0.5 "
            "--warmup 0.5 --out benchmarks/results/attack-latency-{date}.json"),
    Command("churn", CHURN,
            "python benchmarks/bench_churn.py --backend host --out benchmarks/results/churn-host-{date}.json",
            _SMALL_CHURN + " --out benchmarks/results/churn-host-{date}.json"),
    Command("churn_model_2MiB", CHURN,
            "python benchmarks/bench_churn.py --backend host --space-option cost_model=h100 --space-option extent_size=2MiB "
            "--out benchmarks/results/churn-host-h100-model-extent2MiB-{date}.json",
            _SMALL_CHURN + " --space-option cost_model=h100 --space-option extent_size=2MiB "
            "--out benchmarks/results/churn-host-h100-model-extent2MiB-{date}.json"),
    Command("churn_model_256MiB", CHURN,
            "python benchmarks/bench_churn.py --backend host --space-option cost_model=h100 "
            "--space-option extent_size=256MiB --out benchmarks/results/churn-host-h100-model-extent256MiB-{date}.json",
            _SMALL_CHURN + " --space-option cost_model=h100 --space-option extent_size=256MiB "
            "--out benchmarks/results/churn-host-h100-model-extent256MiB-{date}.json"),
    Command("evict_model", EVICT_MODEL,
            "python benchmarks/bench_evict.py --backend host --cost-model h100 "
            "--out benchmarks/results/evict-host-h100-model-{date}.json",
            "python benchmarks/bench_evict.py --backend host --cost-model h100 --quick "
            "--out benchmarks/results/evict-host-h100-model-{date}.json"),
    Command("evict_model_h200", EVICT_MODEL_H200,
            "python benchmarks/bench_evict.py --backend host --cost-model h200 "
            "--out benchmarks/results/evict-host-h200-model-{date}.json",
            "python benchmarks/bench_evict.py --backend host --cost-model h200 --quick "
            "--out benchmarks/results/evict-host-h200-model-{date}.json"),
    Command("activation_sizes", SIZES,
            "python benchmarks/saved_activation_sizes.py --out benchmarks/results/saved_activation_sizes-{date}.json",
            "python benchmarks/saved_activation_sizes.py --models cnn,tiny_transformer --batches cnn=16,tiny_transformer=8 "
            "--out benchmarks/results/saved_activation_sizes-{date}.json"),
    Command("trace", TRACES,
            "python benchmarks/bench_trace.py --label after --host-memory-limit 20GiB "
            "--out benchmarks/results/trace-host-after-{date}.json",
            "python benchmarks/bench_trace.py --trace tiny_gpt2 --quick --label after "
            "--out benchmarks/results/trace-host-after-{date}.json"),
    Command("trace_compare", TRACES,
            "python benchmarks/bench_trace.py --compare benchmarks/results/trace-host-before-2026-11-26.json "
            "benchmarks/results/trace-host-after-{date}.json",
            None, skip_quick="the comparison needs every stored trace's figures"),
    Command("heldout_extra", HELDOUT, "python benchmarks/record_trace.py --model extra --out {heldout}",
            "python benchmarks/record_trace.py --model tiny_gpt2 --out {heldout}", needs=HF, quick_needs=HF),
    *(Command(f"heldout_{name}", HELDOUT, f"python benchmarks/record_trace.py {args} --name {name} --out {{heldout}}",
              None, needs=HF, skip_quick="--quick records one small trace only (heldout_extra's)")
      for name, args in _trace_models()),
    Command("heldout_trace", HELDOUT,
            "python benchmarks/bench_trace.py --trace {heldout} --quick --host-memory-limit 20GiB --label after "
            "--out benchmarks/results/trace-host-heldout-after-{date}.json",
            "python benchmarks/bench_trace.py --trace {heldout} --quick --label after "
            "--out benchmarks/results/trace-host-heldout-after-{date}.json"),
    Command("heldout_compare", HELDOUT,
            "python benchmarks/bench_trace.py --compare benchmarks/results/trace-host-heldout-before-2026-11-26.json "
            "benchmarks/results/trace-host-heldout-after-{date}.json",
            None, skip_quick="the comparison needs every held-out trace's figures"),
    Command("sim", SIM,
            "python benchmarks/sim_torch_allocator.py --out benchmarks/results/sim_torch_allocator-{date}.json",
            "python benchmarks/sim_torch_allocator.py --trace tiny_gpt2 "
            "--out benchmarks/results/sim_torch_allocator-{date}.json"),
    Command("sim_heldout", SIM,
            "python benchmarks/sim_torch_allocator.py --trace {heldout} "
            "--out benchmarks/results/sim_torch_allocator-heldout-{date}.json",
            "python benchmarks/sim_torch_allocator.py --trace {heldout} "
            "--out benchmarks/results/sim_torch_allocator-heldout-{date}.json"),
    Command("saved_offload", SAVED,
            "python benchmarks/bench_saved_offload.py --out benchmarks/results/saved_offload-host-{date}.json",
            "python benchmarks/bench_saved_offload.py --trace tiny_gpt2 "
            "--out benchmarks/results/saved_offload-host-{date}.json"),
    Command("saved_offload_heldout", SAVED,
            "python benchmarks/bench_saved_offload.py --trace {heldout} "
            "--out benchmarks/results/saved_offload-host-heldout-{date}.json",
            "python benchmarks/bench_saved_offload.py --trace {heldout} "
            "--out benchmarks/results/saved_offload-host-heldout-{date}.json"),
    Command("regions", REGIONS,
            "python benchmarks/bench_regions.py --out benchmarks/results/regions-host-{date}.json",
            "python benchmarks/bench_regions.py --quick --out benchmarks/results/regions-host-{date}.json"),
    Command("regions_model", REGIONS,
            "python benchmarks/bench_regions.py --cost-model h100 --out benchmarks/results/regions-host-h100-model-{date}.json",
            "python benchmarks/bench_regions.py --cost-model h100 --quick "
            "--out benchmarks/results/regions-host-h100-model-{date}.json"),
)
BY_NAME = {c.name: c for c in COMMANDS}


# -- from a command's text to what runs ---------------------------------------------------------------

def argv_of(text: str, *, date: str, heldout: Path, scratch: Path | None) -> list[str]:
    """The command's arguments with the placeholders filled in; ``python`` is this interpreter. With a
    scratch folder (--quick), every path the command writes (under benchmarks/results/, dated) goes there."""
    out = []
    for i, arg in enumerate(shlex.split(text)):
        if i == 0 and arg == "python":
            out.append(sys.executable)
            continue
        if scratch is not None and arg.startswith(RESULTS) and "{date}" in arg:
            arg = str(scratch / arg[len(RESULTS):])
        out.append(arg.replace("{date}", date).replace("{heldout}", str(heldout)))
    return out


def outputs(argv: list[str]) -> list[Path]:
    """The files a command writes: the values of its --out and --chart (a folder for record_trace.py)."""
    return [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a in ("--out", "--chart")]


def missing_packages(needs: tuple[str, ...]) -> list[str]:
    return [m for m in ("vtalloc", *needs) if importlib.util.find_spec(m) is None]


def path_check_failures(path: Path) -> list[str]:
    """What a benchmark's JSON says failed its path check (empty when it passed or has none)."""
    if path.suffix != ".json" or not path.is_file():
        return []
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return [f"{path}: not readable JSON ({e})"]
    checked = record.get("path_checked") if isinstance(record, dict) else None
    if isinstance(checked, dict) and checked.get("passed") is False:
        return [f"{path}: {f}" for f in checked.get("failures") or ["path check failed"]]
    return []


# -- running ---------------------------------------------------------------------------------------

def run(commands: list[Command], *, quick: bool, date: str, heldout: Path, scratch: Path | None,
        overwrite: bool, keep_going: bool, dry_run: bool, echo=print) -> int:
    """Run (or, dry, list) the commands in order. 0: every one ran and passed; 1: one failed (the
    rest not run unless keep_going); 2: refused before running anything (a package missing, a results
    file already there)."""
    plan: list[tuple[Command, list[str] | None, str]] = []
    for c in commands:
        text = c.quick if quick else c.command
        if text is None:
            plan.append((c, None, f"not run by --quick: {c.skip_quick}"))
            continue
        plan.append((c, argv_of(text, date=date, heldout=heldout, scratch=scratch), text))
    if dry_run:
        echo(f"# {{date}} = {date}, {{heldout}} = {heldout}" + (f", results under {scratch}" if scratch else ""))
        for c, argv, text in plan:
            echo(f"{c.name} [{c.section}]")
            echo(f"    {text}" if argv is not None else f"    ({text})")
        return 0
    refused = []
    for c, argv, _ in plan:
        if argv is None:
            continue
        gone = missing_packages(c.quick_needs if quick else c.needs)
        if gone:
            refused.append(f"{c.name}: needs {', '.join(gone)} (pip install -e '.[bench]')")
        if not overwrite and scratch is None:
            refused += [f"{c.name}: {p} exists (--overwrite to replace it)" for p in outputs(argv)
                        if p.suffix in (".json", ".png") and p.exists()]
    if refused:
        echo("regenerate_cpu: refused, nothing run:\n  " + "\n  ".join(refused))
        return 2
    failures: list[str] = []
    for c, argv, text in plan:
        if argv is None:
            echo(f"== {c.name}: {text}")
            continue
        echo(f"== {c.name} [{c.section}]\n   {shlex.join(argv)}")
        t0 = time.monotonic()
        rc = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        problems = [f"exited {rc}"] if rc else []
        problems += [f for p in outputs(argv) for f in path_check_failures(p)]
        problems += [f"wrote no {p}" for p in outputs(argv) if not rc and not p.exists()]
        echo(f"== {c.name}: {'FAILED: ' + '; '.join(problems) if problems else 'ok'} ({time.monotonic() - t0:.0f} s)")
        if problems:
            failures.append(f"{c.name}: {'; '.join(problems)}")
            if not keep_going:
                break
    if failures:
        echo("regenerate_cpu: FAILED (a failed path check makes its figures not comparable):\n  "
             + "\n  ".join(failures))
        return 1
    echo(f"regenerate_cpu: {sum(1 for _, a, _ in plan if a is not None)} command(s) ran and passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Run every CPU-measured and cost-model-predicted command of BENCHMARKS.md (its Regenerate "
                    "lines) at HEAD, in order, each writing its JSON under benchmarks/results/ with today's date; "
                    "stop at the first that fails its path check or exits non-zero.",
        epilog="names: " + ", ".join(BY_NAME))
    ap.add_argument("--dry-run", action="store_true", help="list the commands (with --quick: their quick forms)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME[,NAME...]",
                    help="run these commands only, in the file's order (repeatable)")
    ap.add_argument("--quick", action="store_true",
                    help="each command's quick form, writing to a scratch folder (checks the commands work; "
                         "its figures are not for BENCHMARKS.md)")
    ap.add_argument("--scratch", type=Path, default=None,
                    help="--quick: the folder for what the commands write (default: a new temporary folder)")
    ap.add_argument("--heldout-dir", type=Path, default=None,
                    help=f"{{heldout}}: where the held-out traces are recorded and read (default {DEFAULT_HELDOUT}; "
                         "--quick: SCRATCH/heldout)")
    ap.add_argument("--overwrite", action="store_true", help="replace results files already there")
    ap.add_argument("--keep-going", action="store_true", help="run the rest after a failure (exit 1 at the end)")
    a = ap.parse_args(argv)
    names = [n.strip() for spec in a.only for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown name(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    if a.scratch is not None and not a.quick:
        ap.error("--scratch goes with --quick (a full run writes to benchmarks/results/)")
    commands = [c for c in COMMANDS if not names or c.name in names]
    scratch = None
    if a.quick and a.dry_run:
        scratch = a.scratch or Path(tempfile.gettempdir()) / "vtalloc-regenerate-quick-XXXXXXXX"
    elif a.quick:
        scratch = a.scratch or Path(tempfile.mkdtemp(prefix="vtalloc-regenerate-quick-"))
        scratch.mkdir(parents=True, exist_ok=True)
    heldout = a.heldout_dir or (scratch / "heldout" if scratch else DEFAULT_HELDOUT)
    return run(commands, quick=a.quick, date=_dt.date.today().isoformat(), heldout=heldout, scratch=scratch,
               overwrite=a.overwrite, keep_going=a.keep_going, dry_run=a.dry_run)


if __name__ == "__main__":
    sys.exit(main())
