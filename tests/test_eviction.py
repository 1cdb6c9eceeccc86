"""The eviction engine on the host backend: pages go to host memory and come back exact, at
the same address, under explicit offload and under memory pressure, in both modes."""

from __future__ import annotations

import ctypes
import time

import pytest

from vtalloc.allocator import (
    AddressSpace,
    DriverError,
    HostPoolExhaustedError,
    InvalidArgumentError,
    OutOfMemoryError,
)
from helpers.spaces import MiB, PAGE, pattern

MODES = ["mapped", "copy"]


def wait_until(done, timeout_s: float = 10.0) -> None:
    """Poll (each poll completes what finished on the copy stream) until done() or fail."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def space(mode: str, capacity=16 * MiB, host_capacity=128 * MiB, **kw) -> AddressSpace:
    return AddressSpace(backend="host", capacity=capacity, host_capacity=host_capacity, evict_mode=mode, **kw)


@pytest.mark.parametrize("mode", MODES)
def test_offload_and_restore_at_the_same_address(mode):
    with space(mode) as s:
        assert s.evict_mode == mode
        a = s.malloc(5 * MiB)
        s.write(a, pattern(7, 5 * MiB))
        s.offload(a)
        s.synchronize()
        assert s.residency(a) == "evicted"
        st = s.stats()
        assert st.pages_evicted == 3 and st.evicted_bytes == 6 * MiB and st.evictions == 3
        assert st.host_pool_used_bytes == 6 * MiB
        assert st.pages_resident == 0
        s.ensure_resident(a)
        assert s.residency(a) == "resident"
        assert s.read(a, 5 * MiB) == pattern(7, 5 * MiB)
        st = s.stats()
        # Three pages went away and came back, but only the 5 MiB the allocation holds crossed,
        # each way (the last page's free MiB is not copied).
        assert st.restores == 3 and st.bytes_restored_total == 5 * MiB and st.host_pool_used_bytes == 0
        assert st.bytes_evicted_total == 5 * MiB
        assert st.evict_bandwidth_bytes_per_s > 0 and st.restore_bandwidth_bytes_per_s > 0
        s.free(a)


@pytest.mark.parametrize("mode", MODES)
def test_workload_four_times_the_capacity(mode):
    """Evictable allocations holding 4x the capacity all read back bit-exact."""
    with space(mode, capacity=16 * MiB, host_capacity=96 * MiB) as s:
        sizes = [3 * MiB, 2 * MiB, 700_000, 5 * MiB + 11, 64 * 1024, 2 * MiB] * 6
        live = []
        for i, n in enumerate(sizes):
            a = s.malloc(n)
            s.write(a, pattern(i, n))
            s.set_evictable(a)
            live.append((a, n, i))
        total = sum(n for n in sizes)
        assert total >= 4 * 16 * MiB
        st = s.stats()
        assert st.pressure_evictions > 0 and st.mapped_bytes <= st.capacity_bytes
        for a, n, i in live:  # every read restores what it needs, evicting others
            assert s.read(a, n) == pattern(i, n), i
        for a, n, i in reversed(live):
            assert s.read(a, n) == pattern(i, n), i
        for a, _, _ in live:
            s.free(a)
        st = s.stats()
        assert st.host_pool_used_bytes == 0 and st.pages_evicted == 0


@pytest.mark.parametrize("mode", MODES)
def test_non_evictable_pages_are_never_evicted(mode):
    with space(mode) as s:
        pinned = [s.malloc(2 * MiB) for _ in range(4)]
        for i, a in enumerate(pinned):
            s.write(a, pattern(100 + i, 2 * MiB))
        evictable = [s.malloc(2 * MiB) for _ in range(4)]
        for a in evictable:
            s.set_evictable(a)
        extra = [s.malloc(2 * MiB) for _ in range(4)]  # must evict the evictable ones only
        assert all(s.residency(a) == "resident" for a in pinned)
        assert all(s.residency(a) == "evicted" for a in evictable)
        with pytest.raises(OutOfMemoryError):
            s.malloc(2 * MiB)  # everything resident is pinned now
        for i, a in enumerate(pinned):
            assert s.read(a, 2 * MiB) == pattern(100 + i, 2 * MiB)
        for a in pinned + evictable + extra:
            s.free(a)


@pytest.mark.parametrize("mode", MODES)
def test_least_recently_used_goes_first(mode):
    with space(mode, capacity=8 * MiB) as s:
        a, b, c, d = (s.malloc(2 * MiB) for _ in range(4))
        for x in (a, b, c, d):
            s.set_evictable(x)
        s.ensure_resident(a)  # touch a: b is now the least recently used
        e = s.malloc(2 * MiB)
        assert s.residency(b) == "evicted"
        assert [s.residency(x) for x in (a, c, d)] == ["resident"] * 3
        for x in (a, b, c, d, e):
            s.free(x)


@pytest.mark.parametrize("mode", MODES)
def test_shared_page_is_evictable_only_if_all_sharers_are(mode):
    with space(mode, capacity=4 * MiB) as s:
        x, y = s.malloc(1000), s.malloc(1000)  # one shared page
        s.write(x, pattern(1, 1000))
        s.write(y, pattern(2, 1000))
        s.set_evictable(x)
        with pytest.raises(InvalidArgumentError):
            s.offload(x)
        big = s.malloc(2 * MiB)  # fills capacity without evicting the shared page
        with pytest.raises(OutOfMemoryError):
            s.malloc(2 * MiB)
        assert s.residency(x) == "resident"
        s.set_evictable(y)
        s.free(big)
        s.offload(x)
        s.synchronize()
        assert s.residency(x) == s.residency(y) == "evicted"
        z = s.malloc(1000)  # must not land on the evicted shared page
        assert z - z % (2 * MiB) != x - x % (2 * MiB)
        s.write(z, pattern(3, 1000))
        assert s.read(x, 1000) == pattern(1, 1000) and s.read(y, 1000) == pattern(2, 1000)
        for a in (x, y, z):
            s.free(a)


@pytest.mark.parametrize("mode", MODES)
def test_freeing_evicted_allocations(mode):
    with space(mode, capacity=8 * MiB) as s:
        a = s.malloc(4 * MiB)
        small = [s.malloc(512) for _ in range(3)]
        for x in [a] + small:
            s.set_evictable(x)
        for x in [a] + small[:1]:  # the small ones share one page: offloading one moves it
            s.offload(x)
        assert all(s.residency(x) != "resident" for x in small)
        s.free(a)  # possibly still in flight
        for x in small:
            s.free(x)
        s.synchronize()
        st = s.stats()
        assert st.host_pool_used_bytes == 0 and st.pages_evicted == 0 and st.pages_in_flight == 0
        b = s.malloc(8 * MiB)  # the whole capacity is usable again
        s.write(b, pattern(9, 8 * MiB))
        assert s.read(b, 8 * MiB) == pattern(9, 8 * MiB)
        s.free(b)


@pytest.mark.parametrize("mode", MODES)
def test_set_evictable_false_restores(mode):
    with space(mode) as s:
        a = s.malloc(2 * MiB)
        s.write(a, pattern(4, 2 * MiB))
        s.set_evictable(a)
        s.offload(a)
        s.set_evictable(a, False)
        assert s.residency(a) == "resident"
        assert s.stats().evictable_bytes == 0
        assert s.read(a, 2 * MiB) == pattern(4, 2 * MiB)
        s.free(a)


@pytest.mark.parametrize("mode", MODES)
def test_prefetch_then_ensure_resident(mode):
    with space(mode) as s:
        addrs = [s.malloc(2 * MiB) for _ in range(3)]
        for i, a in enumerate(addrs):
            s.write(a, pattern(i, 2 * MiB))
            s.offload(a)
        for a in addrs:
            s.prefetch(a)
            assert s.residency(a) in ("in_flight", "resident")
        for i, a in enumerate(addrs):
            s.ensure_resident(a)
            assert s.residency(a) == "resident"
            assert s.read(a, 2 * MiB) == pattern(i, 2 * MiB)
            s.free(a)


def test_mapped_mode_keeps_evicted_pages_addressable():
    with space("mapped") as s:
        a = s.malloc(2 * MiB)
        s.write(a, pattern(5, 2 * MiB))
        s.offload(a)
        s.synchronize()
        assert s.residency(a) == "evicted" and s.stats().pages_mapped == 0
        # A direct access (as a stray kernel would make) reads the host copy, no fault.
        assert ctypes.string_at(a + 4096, 64) == pattern(5, 2 * MiB)[4096:4096 + 64]
        s.free(a)


@pytest.mark.parametrize("mode", MODES)
def test_host_pool_exhaustion_is_typed_and_loses_nothing(mode):
    with space(mode, capacity=8 * MiB, host_capacity=4 * MiB) as s:
        addrs = [s.malloc(2 * MiB) for _ in range(4)]
        for i, a in enumerate(addrs):
            s.write(a, pattern(i, 2 * MiB))
            s.set_evictable(a)
        s.offload(addrs[0])
        s.offload(addrs[1])
        with pytest.raises(HostPoolExhaustedError):
            s.offload(addrs[2])
        assert isinstance(HostPoolExhaustedError("x"), MemoryError)
        assert s.residency(addrs[2]) == "resident"
        s.synchronize()
        extra = []
        with pytest.raises(OutOfMemoryError):  # pressure cannot evict: the host pool is full
            for _ in range(3):
                extra.append(s.malloc(2 * MiB))
        assert len(extra) == 2  # the two pages freed by the offloads, then nothing
        with pytest.raises(OutOfMemoryError):  # no device page to restore into either
            s.ensure_resident(addrs[0])
        for a in extra:
            s.free(a)
        for i, a in enumerate(addrs):
            assert s.read(a, 2 * MiB) == pattern(i, 2 * MiB)
            s.free(a)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ["copy", "map", "set_access"])
def test_injected_failures_roll_back(mode, op):
    with space(mode) as s:
        a = s.malloc(2 * MiB)
        s.write(a, pattern(11, 2 * MiB))
        if op == "copy":  # eviction fails at its copy: the page stays resident
            s._inject_fault("copy", 1)
            with pytest.raises(DriverError):
                s.offload(a)
            assert s.residency(a) == "resident"
            assert s.stats().host_pool_used_bytes == 0
            assert s.read(a, 2 * MiB) == pattern(11, 2 * MiB)
        s.offload(a)
        s.synchronize()
        s._inject_fault(op, 1)  # restore fails: the bytes stay in the host pool
        with pytest.raises(DriverError):
            s.ensure_resident(a)
        assert s.residency(a) == "evicted"
        st = s.stats()
        assert st.pages_in_flight == 0 and st.host_pool_used_bytes == 2 * MiB
        s.ensure_resident(a)  # and the next try succeeds
        assert s.read(a, 2 * MiB) == pattern(11, 2 * MiB)
        s.free(a)


@pytest.mark.parametrize("op", ["copy", "map"])
def test_a_failure_between_placement_steps_gives_everything_back(op):
    """A malloc short of pages is placed in steps: the policy takes what handles it can, the space
    asks the engine to evict, the policy goes on. An error there (copy: the engine's eviction,
    between two steps; map: the policy's mapping after the engine freed pages) gives back the
    handles taken, the range and anything mapped: no handle is stranded (held, neither mapped nor
    free), the retry gets the same place, and the evictable bytes are intact."""
    with space("copy", capacity=16 * MiB) as s:
        a = s.malloc(12 * MiB)
        s.write(a, pattern(13, 12 * MiB))
        s.set_evictable(a)
        reserved = s.stats().reserved_va_bytes
        s._inject_fault(op, 1)  # two handles fit under capacity, then the engine must evict
        with pytest.raises(DriverError):
            s.malloc(8 * MiB)
        st = s.stats()
        assert st.pages_mapped + st.pages_free == st.pages_total, st
        assert st.allocated_bytes == 12 * MiB and st.num_allocs == 1 and st.reserved_va_bytes == reserved
        b = s.malloc(8 * MiB)
        assert b == a + 12 * MiB  # the range went back to the free space: the retry takes it again
        assert s.read(a, 12 * MiB) == pattern(13, 12 * MiB)
        s.free(b)
        s.free(a)


@pytest.mark.parametrize("size", [2 * MiB, 32 * MiB])  # a page, an extent
def test_a_failed_swap_returns_the_device_page(size):
    """Mapped mode: the restore's copy completed, then mapping the device handle at the address
    (the swap) fails: the handle goes back to the free handles (it used to be stranded: held,
    neither mapped nor free, found by the reliability campaign), the bytes stay in the host pool."""
    with AddressSpace(backend="host", capacity=64 * MiB, host_capacity=64 * MiB, evict_mode="mapped") as s:
        a = s.malloc(size)
        s.write(a, pattern(12, size))
        s.offload(a)
        s.synchronize()
        s.prefetch(a)  # map at the window + set-access, copy: the next map is the swap's
        s._inject_fault("map", 1)
        with pytest.raises(DriverError):
            s.ensure_resident(a)
        st = s.stats()
        assert st.pages_mapped + st.pages_free == st.pages_total, st
        assert s.residency(a) == "evicted" and st.host_pool_used_bytes == size
        s.ensure_resident(a)
        assert s.read(a, size) == pattern(12, size)
        assert s.stats().pages_total == size // (2 * MiB)  # the retry reused the returned handle
        s.free(a)


def test_invalid_eviction_arguments():
    with space("copy") as s:
        a = s.malloc(4096)
        for call in (s.offload, s.prefetch, s.ensure_resident, s.residency, s.set_evictable):
            with pytest.raises(InvalidArgumentError):
                call(a + 512)
            with pytest.raises(InvalidArgumentError):
                call(12345)
        with pytest.raises(InvalidArgumentError):
            s.prefetch(a, stream=-1)
        s.free(a)
        with pytest.raises(InvalidArgumentError):
            s.offload(a)
    with pytest.raises(InvalidArgumentError):
        AddressSpace(backend="host", evict_mode="swap")


def test_malloc_without_eviction_fails_instead():
    with space("copy", capacity=8 * MiB) as s:
        a = s.malloc(6 * MiB)
        s.set_evictable(a)
        with pytest.raises(OutOfMemoryError):
            s.malloc(4 * MiB, evict=False)
        assert s.residency(a) == "resident" and s.stats().evictions == 0
        b = s.malloc(4 * MiB)  # the default evicts
        assert s.residency(a) == "evicted"
        s.free(a)
        s.free(b)


@pytest.mark.parametrize("mode", MODES)
def test_restores_count_in_the_peak_of_mapped_bytes(mode):
    with space(mode) as s:
        a = s.malloc(6 * MiB)
        s.offload(a)
        s.synchronize()
        s.reset_peak_stats()
        assert s.stats().peak_mapped_bytes == 0
        s.ensure_resident(a)
        assert s.stats().peak_mapped_bytes == 6 * MiB
        s.free(a)


@pytest.mark.parametrize("mode", MODES)
def test_an_offloaded_page_keeps_its_device_page_until_memory_is_needed(mode):
    """The mapping under an offloaded page changes only when memory is needed (docs/eviction.md,
    "Ordering"): until then its device page stays mapped, and asking for it back costs no copy."""
    with space(mode, capacity=8 * MiB) as s:
        a = s.malloc(4 * MiB)
        s.write(a, pattern(21, 4 * MiB))
        s.set_evictable(a)
        s.offload(a)
        assert s.residency(a) in ("evicted", "in_flight")
        wait_until(lambda: s.residency(a) == "evicted")
        st = s.stats()
        assert st.pages_evicted == 2 and st.mapped_bytes == 4 * MiB and st.pages_resident == 0
        held = [p for p in s.pages() if p.state == "evicted"]
        assert len(held) == 2 and all(p.page_id is not None for p in held), "the held device pages"
        unmaps = st.num_unmap_calls
        s.ensure_resident(a)  # back without a copy, nothing unmapped
        st = s.stats()
        assert s.residency(a) == "resident" and st.restores == 2 and st.bytes_restored_total == 0
        assert st.num_unmap_calls == unmaps and st.host_pool_used_bytes == 0
        assert s.read(a, 4 * MiB) == pattern(21, 4 * MiB)
        s.offload(a)
        b = s.malloc(6 * MiB)  # needs a device page of a's: released now
        # The malloc waits only for the page it takes; a's other page may still be on its way out.
        wait_until(lambda: s.residency(a) == "evicted")
        st = s.stats()
        assert s.residency(a) == "evicted" and st.pages_resident == 3 and st.host_pool_used_bytes == 4 * MiB
        # b took one of a's device pages at least (both, when both had left before it asked):
        # only those come back by copy.
        released = [p for p in s.pages() if p.state == "evicted" and p.page_id is None]
        assert 1 <= len(released) <= 2
        s.free(b)
        s.ensure_resident(a)
        assert s.stats().bytes_restored_total == len(released) * 2 * MiB
        assert s.read(a, 4 * MiB) == pattern(21, 4 * MiB)
        s.free(a)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("release", [False, True])
def test_a_write_to_an_offloaded_allocation_is_kept_either_way(mode, release):
    """write() reaches evicted bytes where they are: with the device page still held it writes
    both copies, so neither taking the page back nor releasing it loses the write."""
    with space(mode) as s:
        a = s.malloc(2 * MiB)
        s.write(a, pattern(1, 2 * MiB))
        s.offload(a)
        wait_until(lambda: s.residency(a) == "evicted")
        s.write(a, b"new bytes", offset=1000)
        if release:
            s.trim()  # releases the held device page: the host copy is what is left
            assert s.stats().mapped_bytes == 0
        s.ensure_resident(a)
        want = bytearray(pattern(1, 2 * MiB))
        want[1000:1009] = b"new bytes"
        assert s.read(a, 2 * MiB) == bytes(want)
        s.free(a)


def test_a_restored_page_is_swapped_in_by_ensure_resident_or_a_write():
    """Mapped mode: a finished restore leaves the host page at the address until the swap."""
    with space("mapped") as s:
        a = s.malloc(2 * MiB)
        s.write(a, pattern(3, 2 * MiB))
        s.offload(a)
        s.synchronize()  # evicted, device page released, host page at the address
        s.prefetch(a)
        wait_until(lambda: s.residency(a) and s.stats().restores == 1)  # the copy completes; the swap waits
        assert s.residency(a) == "in_flight" and s.stats().host_pool_used_bytes == 2 * MiB
        assert s.read(a, 64) == pattern(3, 64)  # read where it is: the host page
        s.write(a, b"swap")  # a write swaps the device page in first, so no copy goes stale
        assert s.residency(a) == "resident" and s.stats().host_pool_used_bytes == 0
        assert s.read(a, 4) == b"swap" and s.read(a, 64, offset=4) == pattern(3, 68)[4:]
        s.free(a)


def test_pages_prefetched_for_later_give_their_device_pages_back_under_pressure():
    """A prefetch restores ahead of need; when an allocation must be made resident now and no
    other page can be freed, those restores go back to evicted (their bytes are still in the host
    slot) instead of the call failing with an OOM."""
    with AddressSpace(backend="host", capacity=4 * PAGE, host_capacity=16 * PAGE, evict_mode="mapped") as space:
        live = []
        for pages, seed in ((2, 1), (3, 2)):  # 5 pages of live data in a 4-page space
            x = space.malloc(pages * PAGE)
            space.write(x, pattern(seed, pages * PAGE))
            space.set_evictable(x)
            space.offload(x)
            space.synchronize()  # the device pages of x are free again
            live.append(x)
        a, b = live
        space.prefetch(b)  # 3 device pages now hold b's restores
        space.ensure_resident(a)  # needs 2: one free, one from b's prefetch
        assert space.residency(a) == "resident"
        assert space.read(a, 2 * PAGE) == pattern(1, 2 * PAGE)
        space.ensure_resident(b)  # and b still comes back whole, a evicted for it
        assert space.read(b, 3 * PAGE) == pattern(2, 3 * PAGE)
        space.free(a)
        space.free(b)
