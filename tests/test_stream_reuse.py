"""Stream-ordered reuse and the driver call counters (docs/design.md, "Pending frees").

A block freed on stream S is reused by the next allocation on S at once, with no event and no
wait: work on one stream runs in order. Only memory that goes anywhere else (another stream, a
remap) needs an event recorded on S, one per stream for all its open frees. The counters
(`Stats.num_*_calls`) count every driver call a space makes, so these tests pin how many each
path costs; the host test kernels (docs/design.md, "Test kernels") stand in for GPU work that is
still running when the memory changes hands.
"""

from __future__ import annotations

import time

import pytest

from helpers.spaces import MiB, host_space
from vtalloc.allocator import AddressSpace

EVENT_CALLS = ("event_record", "event_query", "event_synchronize", "stream_wait_event", "stream_synchronize")


def calls(space: AddressSpace) -> dict[str, int]:
    return space.stats().driver_calls()


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


@pytest.mark.parametrize("size", [4096, 100_000, 4 * MiB])
@pytest.mark.parametrize("user_stream", [False, True])
def test_same_stream_malloc_free_malloc_records_no_event(size, user_stream):
    with host_space(64 * MiB) as space:
        stream = space._create_stream() if user_stream else 0
        first = space.malloc(size, stream)
        space.free(first)
        before = calls(space)
        for _ in range(100):
            a = space.malloc(size, stream)
            assert a == first, "the block freed on this stream comes back at once"
            space.free(a)
        a = space.malloc(size, stream)
        assert delta(before, calls(space)) == {}, "no event, no poll, no map: not one driver call"
        space.free(a)
        if user_stream:
            space._destroy_stream(stream)


def test_a_larger_free_is_split_for_the_same_stream():
    with host_space(64 * MiB) as space:
        big = space.malloc(8 * MiB)
        space.free(big)
        before = calls(space)
        a, b = space.malloc(2 * MiB), space.malloc(6 * MiB)
        assert (a, b) == (big, big + 2 * MiB)
        assert delta(before, calls(space)) == {}
        s = space.stats()
        assert s.mapped_bytes == 8 * MiB and s.active_bytes == 8 * MiB
        space.free(a)
        space.free(b)


def test_stats_hand_open_frees_to_their_streams():
    """A free shows as cached once its stream passed it, as before: stats() seals the open
    frees (one event per stream that has some) and releases the completed ones."""
    with host_space(64 * MiB) as space:
        addrs = [space.malloc(2 * MiB) for _ in range(4)]
        before = calls(space)
        for a in addrs:
            space.free(a)
        s = space.stats()
        assert s.cached_bytes == 8 * MiB and s.pending_free_bytes == 0
        assert delta(before, calls(space)) == {"event_record": 1, "event_query": 1}


def test_reuse_on_the_same_stream_does_not_wait_for_running_work():
    with host_space(8 * MiB) as space:
        s = space._create_stream()
        a = space.malloc(4 * MiB, s)
        space._run_kernel(a, 4 * MiB, stream=s, kind="fill", seed=1, duration_s=0.3)
        space.free(a)  # the kernel still runs
        t0 = time.monotonic()
        b = space.malloc(4 * MiB, s)
        assert time.monotonic() - t0 < 0.15, "same stream: no wait for the kernel"
        assert b == a
        # Queued after the FILL on the same stream: it overwrites, then checks, in order.
        space._run_kernel(b, 4 * MiB, stream=s, kind="fill", seed=2, duration_s=0.0)
        space._run_kernel(b, 4 * MiB, stream=s, kind="check", seed=2, duration_s=0.0)
        space._synchronize_stream(s)
        k = space._kernel_counters()
        assert (k.kernels_faulted, k.copy_faults, k.bytes_mismatched) == (0, 0, 0) and k.bytes_checked >= 4 * MiB
        space.free(b)
        space._destroy_stream(s)


def reuse_on_another_stream(broken: bool):
    """Capacity for one 4 MiB block: a malloc on T must take the pages a kernel on S still
    writes, freed on S. Returns (seconds the malloc took, driver call deltas, kernel counters)."""
    with host_space(4 * MiB) as space:
        if broken:
            space._break_ordering("free_wait")
        s, t = space._create_stream(), space._create_stream()
        a = space.malloc(4 * MiB, s)
        space._run_kernel(a, 4 * MiB, stream=s, kind="fill", seed=1, duration_s=0.3)
        before = calls(space)
        space.free(a)
        t0 = time.monotonic()
        b = space.malloc(4 * MiB, t)
        took = time.monotonic() - t0
        d = delta(before, calls(space))
        space._run_kernel(b, 4 * MiB, stream=t, kind="fill", seed=2, duration_s=0.0)
        space._run_kernel(b, 4 * MiB, stream=t, kind="check", seed=2, duration_s=0.1)  # while S may still write
        space._synchronize_stream(s)
        space._synchronize_stream(t)
        k = space._kernel_counters()
        space.free(b)
        space._destroy_stream(s)
        space._destroy_stream(t)
    return took, d, k


def test_a_free_reaches_another_stream_after_one_event_and_its_wait():
    took, d, k = reuse_on_another_stream(broken=False)
    assert took > 0.1, "the malloc on T waited for the kernel on S"
    # One event for the open free, a poll (still running), one wait; then both pages are
    # unmapped from the freed range and mapped at the new one.
    assert d == {"event_record": 1, "event_query": 1, "event_synchronize": 1, "unmap": 2, "map": 2,
                 "set_access": 1}, d
    assert (k.kernels_faulted, k.bytes_mismatched) == (0, 0) and k.bytes_checked >= 4 * MiB


@pytest.mark.host_faults
def test_skipping_the_free_wait_is_caught():
    took, d, k = reuse_on_another_stream(broken=True)
    assert took < 0.1 and "event_synchronize" not in d, "T took the block without waiting for S"
    assert k.bytes_mismatched > 0 or k.kernels_faulted > 0, "S's kernel overwrote T's bytes under it"
