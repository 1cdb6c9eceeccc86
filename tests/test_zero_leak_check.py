"""The zero-leak check of tests/conftest.py itself, run on a small test file of its own.

Owns: the proof that the autouse check fails a test that ends holding a page, and passes one
whose only holder is garbage in a reference cycle (freed by the collection the check runs
only when a counter is not 0).
Invariants: the inner run uses this repo's conftest as a plugin and nothing else of tests/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent

INNER = textwrap.dedent('''
    import gc

    from vtalloc.allocator import AddressSpace

    gc.disable()  # only the check's own collection may free the cycle below

    KEPT = []

    def test_a_cycle_that_holds_a_space_is_collected_before_the_check():
        class Holder:
            pass
        h = Holder()
        h.me = h
        h.space = AddressSpace(backend="host", capacity=4 << 20)
        h.block = h.space.malloc(1 << 20)
        del h

    def test_a_space_kept_alive_fails_the_check():
        space = AddressSpace(backend="host", capacity=4 << 20)
        KEPT.append((space, space.malloc(1 << 20)))

    def test_after_the_leak_is_given_back_the_check_passes():
        space, block = KEPT.pop()
        space.free(block)
        space.close()
''')


def test_the_check_fails_a_leak_and_forgives_collectable_garbage(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                        "-c", os.devnull, "--rootdir", str(tmp_path), "-rA", str(tmp_path / "test_inner.py")],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    out = p.stdout + p.stderr
    # -rA lists a test whose teardown failed both as PASSED (its call) and as ERROR (the check)
    assert "ERROR test_inner.py::test_a_cycle_that_holds_a_space_is_collected_before_the_check" not in out, out
    assert "ERROR test_inner.py::test_a_space_kept_alive_fails_the_check" in out, out
    assert "resources still held after the test" in out, out
    assert "ERROR test_inner.py::test_after_the_leak_is_given_back_the_check_passes" not in out, out
    assert "3 passed, 1 error" in out and p.returncode == 1, out
