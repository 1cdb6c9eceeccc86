"""The C ABI under ThreadSanitizer: csrc/tests/stress_threads.cpp (threads malloc, offload,
prefetch, read and free on one space while the host copy-stream worker runs) built with
-fsanitize=thread together with the core's sources. Opt-in (about 50 s on 2 cores):
VTALLOC_SLOW_TESTS=1 (tests/helpers/slow.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.slow import needs_slow_tests

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@needs_slow_tests("builds the core with TSan (~50 s)")
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_threads_offload_prefetch_under_thread_sanitizer(tmp_path):
    sources = sorted(str(p) for p in (REPO / "csrc").rglob("*.cpp") if not {"tests", "torch_binding"} & set(p.parts))
    exe = tmp_path / "stress_tsan"
    subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-fsanitize=thread", f"-I{REPO / 'csrc'}",
                    f"-I{REPO / 'csrc' / 'include'}", *sources, str(REPO / "csrc/tests/stress_threads.cpp"),
                    "-ldl", "-lpthread", "-o", str(exe)], check=True, capture_output=True, timeout=600)
    r = subprocess.run([str(exe), "4", "200"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TSAN_OPTIONS": "halt_on_error=1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failures" in r.stdout and "ThreadSanitizer" not in r.stderr
