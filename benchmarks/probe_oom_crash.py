"""Where an out-of-memory under the torch-native binding crashes: the native stack, on a GPU.

On the H100 of 2026-11-26 every out-of-memory under ``enable()`` with the torch-native binding
(a 1 TiB ``torch.empty`` over a 1 GiB capacity; an allocation over
``set_per_process_memory_fraction``) killed the process with SIGSEGV and an empty stderr,
where ``torch.OutOfMemoryError`` was expected (docs/gpu-validation.md). This probe runs such an
allocation in a fresh interpreter, with Python's faulthandler on, and, when it dies by a signal
and a debugger is on PATH (``cuda-gdb`` is on the lent GPU machines, ``gdb`` elsewhere), once
more under the debugger in batch mode for the native backtrace of every thread.

Owns: the crash's evidence, in one JSON: how each run ended, its stderr, the debugger's
backtrace.
Invariants: measures nothing; exits 0 when the allocation raised torch.OutOfMemoryError, 1
when it crashed or raised something else, 2 when there is no GPU to ask.

    python benchmarks/probe_oom_crash.py --out "$OUT/oom_crash.json"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import json, sys
import torch
import vtalloc.allocator.torch as vt
vt.enable(binding=sys.argv[1], capacity="1GiB")
print("binding:", vt.binding(), flush=True)
try:
    torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
    print(json.dumps({"raised": None}))
except torch.OutOfMemoryError as e:
    print(json.dumps({"raised": "torch.OutOfMemoryError", "message": str(e)[:400]}))
except Exception as e:
    print(json.dumps({"raised": type(e).__name__, "message": str(e)[:400]}))
"""

DEBUGGER_COMMANDS = ["-batch", "-ex", "set pagination off", "-ex", "handle SIGSEGV stop print",
                     "-ex", "run", "-ex", "thread apply all bt 40", "-ex", "info sharedlibrary"]


def run(argv: list[str], timeout: float) -> dict:
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"outcome": "timed out", "timeout_s": timeout}
    last = p.stdout.strip().splitlines()[-1:] or [""]
    try:
        result = json.loads(last[0])
    except json.JSONDecodeError:
        result = None
    return {"returncode": p.returncode, "result": result, "stdout": p.stdout[-4000:], "stderr": p.stderr[-12000:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binding", default="native", choices=["native", "pluggable"])
    ap.add_argument("--timeout", type=float, default=240, help="seconds per run")
    ap.add_argument("--out", default="oom_crash.json")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to probe")
        return 2
    record: dict = {"binding": a.binding, "torch": torch.__version__}
    plain = run([sys.executable, "-c", SCRIPT, a.binding], a.timeout)
    record["plain"] = plain
    crashed = plain.get("returncode", 0) < 0 or plain.get("outcome") == "timed out"
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    if crashed and debugger:
        record["debugger"] = debugger
        record["under_debugger"] = run([debugger, *DEBUGGER_COMMANDS, "--args", sys.executable, "-c", SCRIPT,
                                        a.binding], a.timeout)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    raised = (plain.get("result") or {}).get("raised")
    print(f"{a.binding} binding: exit {plain.get('returncode')}, raised {raised}; "
          f"{'debugger backtrace in ' + a.out if 'under_debugger' in record else 'no debugger run'}")
    return 0 if raised == "torch.OutOfMemoryError" else 1


if __name__ == "__main__":
    sys.exit(main())
