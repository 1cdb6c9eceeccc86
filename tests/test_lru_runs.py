"""LruPolicy's runs against the list of pages they stand for (csrc/tests/lru_runs_model.cpp).

Owns: building the model checker with the C++ compiler and running it over many seeds.
Invariants: the eviction order must be exactly the one a per-page list gives under the same
calls (note_use, forget, forget_range, clear, a visit that stops at a taken page); skipped only
where no g++ is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_lru_runs_give_the_order_of_a_page_list(tmp_path):
    exe = tmp_path / "lru_runs_model"
    subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    f"-I{REPO / 'csrc'}", f"-I{REPO / 'csrc' / 'include'}", str(REPO / "csrc/tests/lru_runs_model.cpp"),
                    "-o", str(exe)], check=True, capture_output=True, timeout=300)
    r = subprocess.run([str(exe), "60", "1500"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failures" in r.stdout
