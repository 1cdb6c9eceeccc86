"""The address space's test hooks, now its extension's (csrc/space/testing/): they run on an
open space only, under its lock, and a space's user streams go when it closes.

A closed space is reached here through the C ABI with its handle kept (vta_space_close, not
destroy), the way a careless caller would: every hook, and the cost model's clock, must answer
VTA_ERR_CLOSED. Before, vta_debug_inject_fault on such a space called through the backend close()
had released (a null dereference), and vta_space_modeled_ns read the freed call counter; the
child process here shows it either way.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from vtalloc.allocator import AddressSpace, _native
from vtalloc.allocator.errors import VtallocError

PAGE = 2 << 20

_CHILD = textwrap.dedent("""
    import ctypes
    from vtalloc.allocator import _native
    from vtalloc.allocator.config import Config
    lib = _native.load()
    raw = _native.make_config(Config(backend="host", capacity=8 << 20))
    h = ctypes.c_void_p()
    assert lib.vta_space_create(ctypes.byref(raw), ctypes.byref(h)) == 0
    assert lib.vta_space_close(h) == 0
    u64, counters = ctypes.c_uint64(), _native.VtaKernelCounters()
    codes = [lib.vta_debug_inject_fault(h, 0, 1), lib.vta_debug_inject_fault_after(h, 0, 0, 1),
             lib.vta_debug_break_ordering(h, 0), lib.vta_debug_stream_create(h, ctypes.byref(u64)),
             lib.vta_debug_stream_destroy(h, 1), lib.vta_debug_stream_synchronize(h, 0),
             lib.vta_debug_run_kernel(h, 0, 0, 512, 0, 0, 0), lib.vta_debug_kernel_counters(h, ctypes.byref(counters)),
             lib.vta_debug_victim_counters(h, ctypes.byref(u64), ctypes.byref(u64)),
             lib.vta_space_modeled_ns(h, ctypes.byref(ctypes.c_int32()), ctypes.byref(u64))]
    lib.vta_space_destroy(h)
    print(codes)
""")


def test_every_hook_refuses_a_closed_space():
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str([5] * 10)  # VTA_ERR_CLOSED from each


def test_user_streams_end_with_their_space():
    """User streams left with kernels queued on them are drained and destroyed by close(),
    before the pages go: no fault is caught, no stream is left."""
    streams_before = _native.global_counters()["live_streams"]
    faults_before = _native.guarded_fault_totals()
    with AddressSpace(backend="host", capacity=8 * PAGE) as space:
        a = space.malloc(PAGE)
        for _ in range(2):
            space._run_kernel(a, PAGE, stream=space._create_stream(), kind="fill", seed=1, duration_s=0.05)
        assert _native.global_counters()["live_streams"] > streams_before
    assert _native.global_counters()["live_streams"] == streams_before
    assert _native.guarded_fault_totals() == faults_before


def test_faults_injected_are_the_spaces_own():
    """Each space has its own injector (the extension is per space): a fault armed on one never
    fires on another."""
    with AddressSpace(backend="host", capacity=4 * PAGE) as armed, \
            AddressSpace(backend="host", capacity=4 * PAGE) as other:
        armed._inject_fault("map", 1)
        b = other.malloc(PAGE)  # maps a page: the other space's injector is disarmed
        other.free(b)
        try:
            armed.malloc(PAGE)
        except VtallocError as e:
            assert "injected failure of map" in str(e)
        else:
            raise AssertionError("the armed space's map did not fail")
        armed._inject_fault("map", 0)
