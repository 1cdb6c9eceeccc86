"""Test kernels on the host backend: stream work over an allocation's bytes, and fault counting.

A test kernel (FILL or CHECK) runs on a stream for a while, like a GPU kernel; an access to an
address that is not mapped at that moment is counted as a fault instead of killing the process
(on a GPU it would poison the context), so races between mapping changes and stream work can
be counted on a CPU. docs/design.md, "Test kernels", has the details.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from vtalloc.allocator import (
    AddressSpace,
    BackendUnavailableError,
    ClosedError,
    InvalidArgumentError,
    global_counters,
)
from vtalloc.allocator.stats import KernelCounters
from helpers.kernels import inaccessible, kernel_pattern
from helpers.spaces import MiB, host_space, pattern

LONG = 5.0  # a kernel meant to be stopped by a fault long before it ends


def counters(space: AddressSpace) -> KernelCounters:
    return space._kernel_counters()


def wait_for(predicate, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_fill_then_check_on_one_stream_finds_no_mismatch():
    with host_space() as space:
        n = 3 * MiB + 5  # not a multiple of 8: the tail is checked too
        a = space.malloc(n)
        s = space._create_stream()
        space._run_kernel(a, n, stream=s, kind="fill", seed=11)
        space._run_kernel(a, n, stream=s, kind="check", seed=11)
        space._destroy_stream(s)
        assert counters(space) == KernelCounters(2, 2, 0, 0, n, 0)
        space.free(a)


def test_fill_writes_the_pattern_of_seed_and_byte_index_and_nothing_else():
    with host_space() as space:
        a = space.malloc(8192)
        space.write(a, pattern(1, 8192))
        off, n = 3, 1001  # unaligned start, odd length: the pattern is by index in the range
        space._run_kernel(a + off, n, stream=0, kind="fill", seed=42)
        got = space.read(a, 8192)
        assert got[off:off + n] == kernel_pattern(42, n)
        assert got[:off] == pattern(1, 8192)[:off] and got[off + n:] == pattern(1, 8192)[off + n:]
        assert kernel_pattern(42, n) != kernel_pattern(43, n)
        space.free(a)


def test_check_with_another_seed_counts_exactly_the_differing_bytes():
    with host_space() as space:
        n = 4099
        a = space.malloc(n)
        space._run_kernel(a, n, stream=0, kind="fill", seed=1)
        space._run_kernel(a, n, stream=0, kind="check", seed=2)
        differing = sum(x != y for x, y in zip(kernel_pattern(1, n), kernel_pattern(2, n)))
        assert n - 40 < differing < n  # about 1 byte in 256 agrees by chance
        c = counters(space)
        assert (c.bytes_checked, c.bytes_mismatched) == (n, differing)
        space.free(a)


def test_check_counts_the_bytes_that_were_corrupted():
    with host_space() as space:
        n = 2 * MiB
        a = space.malloc(n)
        space._run_kernel(a, n, stream=0, kind="fill", seed=5)
        space.write(a, bytes(b ^ 0xFF for b in space.read(a + 100, 3)), offset=100)
        space.write(a, bytes([space.read(a + n - 1, 1)[0] ^ 1]), offset=n - 1)
        space._run_kernel(a, n, stream=0, kind="check", seed=5)
        assert counters(space).bytes_mismatched == 4
        space.free(a)


def test_kernels_on_a_stream_run_in_order_and_asynchronously():
    with host_space() as space:
        n = MiB
        a = space.malloc(n)
        s = space._create_stream()
        t0 = time.monotonic()
        space._run_kernel(a, n, stream=s, kind="fill", seed=9, duration_s=0.3)
        space._run_kernel(a, n, stream=s, kind="check", seed=9)  # queued behind the fill
        launched_in = time.monotonic() - t0
        assert launched_in < 0.3, "_run_kernel waited for the kernel"
        space.synchronize()  # waits for pending frees and in-flight pages, not for user streams
        c = counters(space)
        assert c.kernels_launched == 2 and c.kernels_running == 2
        space._synchronize_stream(s)
        assert time.monotonic() - t0 >= 0.3
        c = counters(space)
        # The check ran after the whole fill: had it overlapped, it would have seen zeros.
        assert (c.kernels_completed, c.kernels_running, c.bytes_checked, c.bytes_mismatched) == (2, 0, n, 0)
        space._destroy_stream(s)
        space.free(a)


def test_a_kernel_repeats_whole_passes_for_its_duration():
    with host_space() as space:
        n = 64 * 1024
        a = space.malloc(n)
        space._run_kernel(a, n, stream=0, kind="fill", seed=3)
        t0 = time.monotonic()
        space._run_kernel(a, n, stream=0, kind="check", seed=3, duration_s=0.05)  # stream 0: on this thread
        assert time.monotonic() - t0 >= 0.05
        c = counters(space)
        assert c.kernels_completed == 2 and c.bytes_mismatched == 0
        assert c.bytes_checked % n == 0 and c.bytes_checked >= 2 * n
        space.free(a)


@pytest.mark.host_faults
def test_a_kernel_whose_range_becomes_inaccessible_while_it_runs_counts_a_fault():
    with host_space() as space:
        n = 2 * MiB  # page-aligned, so the whole allocation can be protected
        a = space.malloc(n)
        s = space._create_stream()
        space._run_kernel(a, n, stream=s, kind="fill", seed=7, duration_s=LONG)
        wait_for(lambda: space.read(a, 8) == kernel_pattern(7, 8))  # it is running
        t0 = time.monotonic()
        with inaccessible(a, n):  # what an unmap under running stream work does to it
            space._synchronize_stream(s)
        assert time.monotonic() - t0 < LONG / 2, "the kernel ran on: no fault"
        c = counters(space)
        assert (c.kernels_faulted, c.kernels_completed) == (1, 0)

        # The stream's worker survived with the signal unblocked: it runs kernels and catches
        # another fault.
        space._run_kernel(a, n, stream=s, kind="fill", seed=8)
        space._run_kernel(a, n, stream=s, kind="check", seed=8)
        space._synchronize_stream(s)
        with inaccessible(a, n):
            space._run_kernel(a, n, stream=s, kind="check", seed=8)
            space._synchronize_stream(s)
        c = counters(space)
        assert (c.kernels_launched, c.kernels_completed, c.kernels_faulted, c.bytes_mismatched) == (4, 2, 2, 0)
        space._destroy_stream(s)
        space.free(a)


@pytest.mark.host_faults
def test_freeing_and_trimming_under_a_kernel_on_another_stream_is_a_counted_race():
    """The race itself, through the public API: the free is ordered on the allocation's stream
    (0), not on the kernel's, so trim() unmaps the pages while the kernel still writes them."""
    with host_space() as space:
        n = 2 * MiB
        a = space.malloc(n)
        s = space._create_stream()
        space._run_kernel(a, n, stream=s, kind="fill", seed=2, duration_s=LONG)
        wait_for(lambda: space.read(a, 8) == kernel_pattern(2, 8))
        t0 = time.monotonic()
        space.free(a)
        assert space.trim() == n  # unmapped and released under the running kernel
        space._synchronize_stream(s)
        assert time.monotonic() - t0 < LONG / 2, "the kernel ran on: no fault"
        c = counters(space)
        assert (c.kernels_faulted, c.kernels_completed) == (1, 0)
        space._destroy_stream(s)


@pytest.mark.host_faults
def test_a_copy_that_touches_an_inaccessible_address_counts_a_copy_fault():
    with host_space() as space:
        n = 2 * MiB
        a = space.malloc(n)
        space.write(a, pattern(4, n))
        with inaccessible(a, n):
            got = space.read(a, 4096)  # the copy is abandoned: its bytes are not the allocation's
            space.write(a, b"x" * 4096)
        assert got != pattern(4, n)[:4096]
        assert counters(space).copy_faults == 2
        assert space.read(a, n) == pattern(4, n), "the faulted copies changed nothing"
        assert counters(space).copy_faults == 2
        space.free(a)


@pytest.mark.host_faults
def test_a_kernel_on_stream_0_that_faults_returns_to_the_caller():
    with host_space() as space:
        n = 2 * MiB
        a = space.malloc(n)
        with inaccessible(a, n):
            space._run_kernel(a, n, stream=0, kind="check", seed=1)
        space._run_kernel(a, n, stream=0, kind="fill", seed=1)
        c = counters(space)
        assert (c.kernels_faulted, c.kernels_completed) == (1, 1)
        space.free(a)


CRASH = """
import ctypes, signal, sys
from vtalloc.allocator import AddressSpace
if sys.argv[1] == "ignored":
    signal.signal(signal.SIGSEGV, signal.SIG_IGN)
with AddressSpace(backend="host", capacity=64 << 20) as space:
    a = space.malloc(4096)
    space._run_kernel(a, 4096, stream=0, kind="fill")  # installs the fault guard
    space.write(a, b"x")                                # a guarded copy too
    space.free(a)
print("crashing", flush=True)
ctypes.string_at(0)
print("survived", flush=True)
"""


@pytest.mark.parametrize("previous", ["default", "faulthandler", "ignored"])
def test_a_fault_outside_any_guard_still_kills_the_process(previous):
    """The guard's handler chains to the one before it: real crashes are not swallowed."""
    flags = ["-X", "faulthandler"] if previous == "faulthandler" else []
    proc = subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(CRASH), previous], capture_output=True, text=True, timeout=20
    )
    assert "crashing" in proc.stdout and "survived" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr)
    if previous == "faulthandler":  # its handler ran: the chain reached it
        assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr


def test_bad_arguments_are_refused_and_change_nothing():
    with host_space() as space:
        a = space.malloc(MiB)
        s = space._create_stream()
        bad_calls = [
            dict(kind="copy"), dict(kind=None), dict(duration_s=-1.0), dict(duration_s=math.nan),
            dict(duration_s=61.0), dict(duration_s=True), dict(duration_s="1"), dict(seed=-1), dict(seed=1 << 64),
            dict(stream=12345), dict(stream=-1),
        ]
        for kw in bad_calls:
            args = dict(stream=s, kind="fill", seed=0, duration_s=0.0) | kw
            with pytest.raises(InvalidArgumentError):
                space._run_kernel(a, 4096, **args)
        for address, nbytes in [(a, 0), (a, -1), (a, MiB + 1), (a + MiB - 8, 16), (a + MiB, 8), (a, 1 << 64)]:
            with pytest.raises(InvalidArgumentError):
                space._run_kernel(address, nbytes, stream=s)
        other = space.malloc(4096)
        space.free(other)
        with pytest.raises(InvalidArgumentError):
            space._run_kernel(other, 4096, stream=s)  # freed: not a live allocation
        with pytest.raises(InvalidArgumentError):
            space._destroy_stream(12345)
        with pytest.raises(InvalidArgumentError):
            space._destroy_stream(0)  # the default stream is not the space's to destroy
        with pytest.raises(InvalidArgumentError):
            space._synchronize_stream(12345)
        assert counters(space).kernels_launched == 0
        on_s = space.malloc(4096, stream=s)
        with pytest.raises(InvalidArgumentError, match="live allocations"):
            space._destroy_stream(s)  # its frees and evictions would record events on it
        space.free(on_s)
        space._destroy_stream(s)
        with pytest.raises(InvalidArgumentError):
            space._run_kernel(a, 4096, stream=s)  # destroyed
        space.free(a)
    with pytest.raises(ClosedError):
        space._run_kernel(a, 4096, stream=0)
    for call in (space._create_stream, space._kernel_counters, lambda: space._destroy_stream(s)):
        with pytest.raises(ClosedError):
            call()


def test_closing_the_space_waits_for_and_destroys_its_streams():
    space = host_space()
    a = space.malloc(MiB)
    streams = [space._create_stream() for _ in range(3)]
    assert global_counters()["live_streams"] >= 3
    space._run_kernel(a, MiB, stream=streams[0], kind="fill", seed=1, duration_s=0.1)
    space.close()  # the kernel runs to its end before the pages go: no fault
    assert global_counters()["live_streams"] == 0


@pytest.mark.gpu
def test_the_cuda_backend_refuses_test_kernels():
    with AddressSpace(backend="cuda", capacity=64 * MiB) as space:
        a = space.malloc(4096)
        with pytest.raises(BackendUnavailableError, match="host backend only"):
            space._run_kernel(a, 4096, stream=0)
        with pytest.raises(BackendUnavailableError):
            space._kernel_counters()
        space.free(a)
