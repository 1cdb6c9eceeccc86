"""Run a Python snippet in a fresh interpreter and read the JSON it prints last.

GPU tests of the torch allocator need this: PyTorch's allocator can be chosen only once per
process, and the test process itself must stay free of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    """Run ``code`` (dedented) with ``args``; fail the test with its output unless it exits 0 and
    its last stdout line is a JSON object, which is returned."""
    # A crash in native code then prints the Python stack that led to it: three GPU tests of
    # 2026-11-26 died of SIGSEGV with an empty stderr.
    full_env = dict(os.environ, PYTHONFAULTHANDLER="1")
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, env=full_env,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        pytest.fail(
            f"subprocess exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"last stdout line is not JSON: {lines[-1]!r}\n--- stderr ---\n{proc.stderr[-6000:]}")
    if not isinstance(out, dict):
        pytest.fail(f"expected a JSON object, got {out!r}")
    return out
