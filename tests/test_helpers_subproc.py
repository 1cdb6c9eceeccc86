"""tests/helpers/subproc.py, the fresh interpreter the GPU tests of the torch allocator run in.

Owns: that a child killed by a signal in native code fails the test with the Python stack
that led to the crash (the GPU run of 2026-11-26 had three SIGSEGVs with an empty stderr).
Invariants: nothing here needs a GPU.
"""

from __future__ import annotations

import pytest

from helpers.subproc import run_python


def test_a_native_crash_fails_with_the_python_stack():
    with pytest.raises(pytest.fail.Exception) as e:
        run_python("""
            import ctypes
            def touch_address_zero():
                ctypes.string_at(8, 1)  # an unmapped address
            touch_address_zero()
        """, timeout=60)
    text = str(e.value)
    assert "subprocess exited -11" in text
    assert "Segmentation fault" in text and "touch_address_zero" in text


def test_the_last_json_line_is_returned():
    assert run_python("import json, sys; print('noise'); print(json.dumps({'argv': sys.argv[1:]}))", "a") == {"argv": ["a"]}
