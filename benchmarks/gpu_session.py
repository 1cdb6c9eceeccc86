"""gpu_session: everything a GPU session should run for vtalloc, in stages that fit one call each.

Owns: the list of GPU checks and benchmarks (docs/gpu-validation.md, "What to run on a GPU"),
grouped in stages of at most ~9.5 minutes each (a lent GPU machine runs one command for at most
10 minutes; since 2026-11-27 a session has 15 minutes of device time in all, its start
included, so ``first`` is the stage such a session runs), and running one stage: each step in
its own process with its own time limit, its output and JSON in one folder, a summary of what
ran, passed, failed, timed out or was skipped for want of time.
Invariants: a step that fails or times out never stops the stage (the next step still runs);
a step whose estimate no longer fits the stage's budget is skipped and recorded as such, never
started; the summary is written after every step, so a stage killed from outside still leaves
what it finished; nothing here measures anything itself: the figures are the steps' own JSON.

    python benchmarks/gpu_session.py --list                      # the stages and their steps
    python benchmarks/gpu_session.py --stage first --out "$OUT"   # ~5 min: the OOM tests, every gpu test, eviction, churn
    python benchmarks/gpu_session.py --stage check --out "$OUT"   # then torch, paging, stress, training, memory
    python benchmarks/gpu_session.py --stage check --dry-run      # the commands, not run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE_BUDGET_S = 570  # a call may run 600 s; leave room for the start and the summary
INTERRUPT_GRACE_S = 20  # a step past its time gets SIGINT, then this long to report, then SIGKILL


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]  # "{py}" is this interpreter, "{out}" the stage's output folder
    estimate_s: int        # expected wall time on an H100 machine (16 cores): an estimate from
                           # the 2026-11-22 session's runs, to be corrected by the first stage run
    timeout_s: int         # the step is killed past this

    def command(self, out: Path) -> list[str]:
        return [a.replace("{py}", sys.executable).replace("{out}", str(out)) for a in self.argv]


def _py(script: str, *args: str) -> tuple[str, ...]:
    return ("{py}", script, *args)


# The gpu tests of vtalloc as torch's allocator: the "torch" stage runs these, "check" the rest.
TORCH_TEST_FILES = ("tests/test_torch_binding_gpu.py", "tests/test_torch_demo.py", "tests/test_torch_gpu.py")

# The build step is cheap when the library is already built (a warm machine keeps it).
BUILD = Step("build", _py("benchmarks/gpu_session.py", "--build-if-needed"), 60, 240)

# Every pytest command here: -p no:benchmark (pytest-benchmark beside xdist stops a run with an
# INTERNALERROR on the GPU image of 2026-11-28) and no cache folder.
PYTEST = ("-m", "pytest", "-p", "no:benchmark", "-p", "no:cacheprovider", "-rfEs", "--tb=short", "--durations=0")

# Steps that more than one stage runs (the first stage asks each question once; the later ones
# go deeper), defined once so the stages cannot drift apart.
DEMO = Step("demo", _py("-m", "vtalloc.client", "demo"), 40, 90)
GPU_TESTS_CORE = Step("gpu_tests_core", _py(*PYTEST, "-q", "-m", "gpu", *(f"--ignore={f}" for f in TORCH_TEST_FILES),
                                            "--continue-on-collection-errors", "--junitxml={out}/gpu_tests_core.xml"),
                      120, 240)
EVICT_32MIB = Step("bench_evict_32MiB", _py("benchmarks/bench_evict.py", "--backend", "cuda", "--size", str(32 << 20),
                                            "--out", "{out}/evict_32MiB.json"), 20, 120)
MALLOC_FREE = Step("bench_malloc_free", _py("benchmarks/bench_malloc_free.py", "--backend", "cuda", "--quick",
                                            "--out", "{out}/malloc_free.json"), 30, 120)

# An out-of-memory under enable() must be torch.OutOfMemoryError and the process must go on (it
# was a SIGSEGV under the torch-native binding on the H200 of 2026-11-28): asked first.
OOM_TESTS = ("tests/test_oom_gpu.py",
             "tests/test_torch_binding_gpu.py::test_oom_is_torch_out_of_memory_error_with_vtalloc_numbers",
             "tests/test_torch_binding_gpu.py::test_empty_cache_memory_fraction_and_ipc_refusal",
             "tests/test_torch_gpu.py::test_out_of_memory_is_torch_out_of_memory_error_and_the_process_goes_on")
OOM = Step("oom_tests", _py(*PYTEST, "-v", "-m", "gpu", "-n", "4", "--junitxml={out}/oom_tests.xml", *OOM_TESTS), 60, 150)

STAGES: dict[str, tuple[Step, ...]] = {
    # A session lent 15 minutes of device time in all (the machine's start included) gets one
    # call of about 5 minutes and room to run it again: the OOM tests first, then every gpu test
    # (all 42 took 102 s with -n 6 on the H200 of 2026-11-28; the OOM tests are not run twice),
    # eviction at 32 MiB in both modes with auto's pick, and the churn with vtalloc on cuda.
    "first": (
        BUILD,
        OOM,
        Step("gpu_tests_all", _py(*PYTEST, "-q", "-m", "gpu", "-n", "6", "--ignore=tests/test_oom_gpu.py",
                                  "--continue-on-collection-errors", "--junitxml={out}/gpu_tests_all.xml"), 130, 240),
        EVICT_32MIB,
        Step("bench_churn", _py("benchmarks/bench_churn.py", "--out", "{out}/churn.json"), 40, 120),
    ),
    # What the first stage's failures were made of (2026-11-28): why the binding's stream
    # crashed, where eviction's and restore's fixed costs go. Run beside "first" when there is time.
    "diagnose": (
        BUILD,
        Step("probe_binding_streams", _py("benchmarks/probe_binding_streams.py", "--old-binding", ".old_binding/csrc",
                                          "--out", "{out}/binding_streams.json"), 80, 200),
        Step("probe_restore_overhead", _py("benchmarks/probe_restore_overhead.py", "--repeats", "5",
                                           "--out", "{out}/restore_overhead.json"), 30, 120),
    ),
    # Correctness first: if these fail, the figures of the later stages mean little. The gpu
    # tests took ~540 s in all on the H100 (2026-11-26): split in two stages, torch's own second.
    "check": (
        BUILD,
        Step("probe_oom_crash", _py("benchmarks/probe_oom_crash.py", "--out", "{out}/oom_crash.json"), 60, 150),
        GPU_TESTS_CORE,
        DEMO,
        Step("probe_copy_paths", _py("benchmarks/probe_copy_paths.py", "--with-compute", "--max-seconds", "150",
                                     "--out", "{out}/probe_copy_paths.json"), 30, 200),
    ),
    "torch": (
        BUILD,
        Step("gpu_tests_torch", _py(*PYTEST, "-v", "-m", "gpu", "--junitxml={out}/gpu_tests_torch.xml",
                                    *TORCH_TEST_FILES), 420, 480),
    ),
    # Paging and allocation speed: issue 10's eviction, C loop and churn figures. Estimates:
    # the H100 walls of 2026-11-26 (evict 6 s, malloc_free 18 s, torch_alloc 40 s) with room.
    "paging": (
        BUILD,
        Step("bench_evict", _py("benchmarks/bench_evict.py", "--backend", "cuda", "--out", "{out}/evict.json"), 20, 120),
        EVICT_32MIB,
        MALLOC_FREE,
        Step("bench_torch_alloc", _py("benchmarks/bench_torch_alloc.py", "--quick", "--out", "{out}/torch_alloc.json"),
             50, 120),
        Step("bench_churn", _py("benchmarks/bench_churn.py", "--out", "{out}/churn.json"), 150, 300),
    ),
    # The paging stress: one ResNet-50 run (6 steps, batch 1024) took 30-45 s on the H100; ten
    # runs at each of three page sizes are three calls of this stage.
    "stress": (
        BUILD,
        Step("stress_paged_training", _py("benchmarks/stress_paged_training.py", "--pages", "2MiB,32MiB,64MiB",
                                          "--runs", "3", "--out", "{out}/stress.json"), 420, 480),
    ),
    # Training against every peer, 4x the native batch measured on the H100 (no batch probe).
    "training": (
        BUILD,
        Step("offload_resnet50", _py("benchmarks/bench_offload_training.py", "--models", "resnet50",
                                     "--batch", "resnet50=256", "--multiples", "4",
                                     "--out", "{out}/offload_resnet50.json", "--chart", "{out}/offload_resnet50.png"),
             240, 300),
        Step("offload_transformer", _py("benchmarks/bench_offload_training.py", "--models", "transformer",
                                        "--batch", "transformer=16", "--multiples", "4",
                                        "--out", "{out}/offload_transformer.json",
                                        "--chart", "{out}/offload_transformer.png"), 240, 300),
    ),
    # Memory: the stored allocation traces of real models (benchmarks/traces/) replayed through
    # torch under the native allocator, expandable segments and vtalloc: peaks first, then the
    # smallest capacity with no OOM, one process per try, searches cut at --max-seconds (each
    # keeps its bracket; the JSON says which are exact). No GPU run yet: the estimate is a guess.
    "memory": (
        BUILD,
        Step("bench_trace_torch", _py("benchmarks/bench_trace.py", "--torch", "--max-seconds", "390",
                                      "--timeout", "60", "--out", "{out}/trace_torch.json"), 450, 500),
    ),
}


def plan_fits(stage: tuple[Step, ...], budget_s: int = STAGE_BUDGET_S) -> bool:
    """Whether the estimates of a stage's steps add up to no more than its budget."""
    return sum(s.estimate_s for s in stage) <= budget_s


def build_if_needed() -> int:
    """Build (pip install -e, no dependencies) only when the core library does not load."""
    probe = [sys.executable, "-c", "from vtalloc.allocator import _native; _native.load()"]
    if subprocess.run(probe, cwd=ROOT, capture_output=True).returncode == 0:
        print("vtalloc's core library loads: no build needed")
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."]
    print("building:", shlex.join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


def run_with_interrupt(cmd: list[str], log, timeout: float, grace_s: float = INTERRUPT_GRACE_S) -> int | None:
    """Run ``cmd`` with its output in ``log``; its exit status, or None when it ran past
    ``timeout``. Past it the step gets SIGINT first, so that pytest prints its failures and
    writes its report (a killed run leaves neither), and SIGKILL ``grace_s`` later."""
    # SIGINT back to its default in the step: a shell runs background jobs with it ignored, and a
    # Python started so ignores it too (no KeyboardInterrupt, so no report: only the SIGKILL).
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return None


def run_stage(name: str, out: Path, budget_s: int, dry_run: bool) -> int:
    steps = STAGES[name]
    if not dry_run:
        out.mkdir(parents=True, exist_ok=True)
    summary = {"stage": name, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "budget_s": budget_s, "steps": []}
    start = time.monotonic()
    worst = 0
    for step in steps:
        cmd = step.command(out)
        left = budget_s - (time.monotonic() - start)
        row = {"step": step.name, "command": shlex.join(cmd), "estimate_s": step.estimate_s}
        if dry_run:
            print(f"{step.name:<24} ~{step.estimate_s:>4} s  {shlex.join(cmd)}")
            continue
        if step.estimate_s > left:
            row.update(outcome="skipped", why=f"{left:.0f} s left of the stage's budget, the step needs ~{step.estimate_s} s")
        else:
            timeout = min(step.timeout_s, max(1, int(left)))
            t0 = time.monotonic()
            with open(out / f"{step.name}.log", "wb") as log:
                try:
                    rc = run_with_interrupt(cmd, log, timeout)
                    if rc is None:
                        row.update(outcome="timed_out", timeout_s=timeout)
                    else:
                        row.update(outcome="passed" if rc == 0 else "failed", rc=rc)
                except OSError as e:  # the command itself is missing
                    row.update(outcome="failed", rc=None, why=str(e))
            row["wall_s"] = round(time.monotonic() - t0, 1)
        if row["outcome"] != "passed":
            worst = 1
        summary["steps"].append(row)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"{step.name:<24} {row['outcome']:<10} {row.get('wall_s', '-')} s", flush=True)
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stage", choices=sorted(STAGES), help="the stage to run")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-session"),
                    help="folder for logs, JSON and summary.json (default: $OUT, else ./gpu-session)")
    ap.add_argument("--budget", type=int, default=STAGE_BUDGET_S, help=f"seconds for the stage (default {STAGE_BUDGET_S})")
    ap.add_argument("--dry-run", action="store_true", help="print the stage's commands, run nothing")
    ap.add_argument("--list", action="store_true", help="print every stage and its steps")
    ap.add_argument("--build-if-needed", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build_if_needed:
        return build_if_needed()
    if args.list:
        for name, steps in STAGES.items():
            print(f"{name}: ~{sum(s.estimate_s for s in steps)} s")
            for s in steps:
                print(f"  {s.name:<24} ~{s.estimate_s:>4} s")
        return 0
    if not args.stage:
        ap.error("give --stage (or --list)")
    if args.budget <= 0:
        ap.error("--budget must be a positive number of seconds")
    out = Path(args.out) / args.stage
    return run_stage(args.stage, out, args.budget, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
