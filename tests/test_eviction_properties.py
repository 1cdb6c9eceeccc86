"""Eviction under concurrency and random operation sequences: every byte read back is the
byte last written, addresses never change, and the accounting closes."""

from __future__ import annotations

import random

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vtalloc.allocator import AddressSpace, HostPoolExhaustedError, InvalidArgumentError, OutOfMemoryError
from helpers.spaces import MiB, pattern
from helpers.threads import run_threads


@pytest.mark.parametrize("extent_size", [None, "4MiB"])  # 4 MiB: extents from 4 MiB up (3 MiB + 7 rounds to one)
@pytest.mark.parametrize("mode", ["mapped", "copy"])
def test_threads_offload_prefetch_alloc_free(mode, extent_size):
    with AddressSpace(backend="host", capacity=24 * MiB, host_capacity=96 * MiB, evict_mode=mode,
                      extent_size=extent_size) as space:
        def worker(seed: int) -> None:
            rng = random.Random(seed)
            mine: list[tuple[int, int, int]] = []
            for step in range(150):
                r = rng.random()
                if mine and r < 0.25:
                    a, n, tag = mine.pop(rng.randrange(len(mine)))
                    assert space.read(a, n) == pattern(tag, n)
                    space.free(a)
                elif mine and r < 0.45:
                    a, _, _ = rng.choice(mine)
                    try:
                        space.offload(a)
                    except (InvalidArgumentError, HostPoolExhaustedError):
                        pass  # shared with another thread's pinned block / pool full: refused, nothing lost
                elif mine and r < 0.6:
                    a, _, _ = rng.choice(mine)
                    try:
                        space.prefetch(a) if rng.random() < 0.5 else space.ensure_resident(a)
                    except OutOfMemoryError:
                        pass
                elif mine and r < 0.7:
                    a, n, tag = rng.choice(mine)
                    assert space.read(a, n) == pattern(tag, n)
                else:
                    n = rng.choice([512, 5000, 300_000, 2 * MiB, 3 * MiB + 7])
                    try:
                        a = space.malloc(n)
                    except OutOfMemoryError:
                        continue
                    tag = seed * 10_000 + step
                    space.write(a, pattern(tag, n))
                    space.set_evictable(a)
                    mine.append((a, n, tag))
            for a, n, tag in mine:
                assert space.read(a, n) == pattern(tag, n)
                space.free(a)

        errors = run_threads(worker, [(i,) for i in range(4)])
        assert not errors, repr(errors[0])
        space.synchronize()
        s = space.stats()
        assert s.num_live_allocs == 0 and s.pages_evicted == 0 and s.host_pool_used_bytes == 0
        assert s.peak_mapped_bytes <= s.capacity_bytes


CAPACITY = 8 * MiB


class EvictionMachine(RuleBasedStateMachine):
    """A model of live allocations; random malloc/free/offload/prefetch/evictable/rewrite."""

    mode = "mapped"
    extent_size: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.space = AddressSpace(backend="host", capacity=CAPACITY, host_capacity=64 * MiB, evict_mode=self.mode,
                                  extent_size=self.extent_size)
        self.live: dict[int, tuple[int, int, bool]] = {}  # address -> (size, tag, evictable)
        self.tag = 0

    def teardown(self) -> None:
        for a in list(self.live):
            self.space.free(a)
        self.space.close()

    def write(self, a: int, n: int) -> int:
        self.tag += 1
        head = min(n, 4096)
        self.space.write(a, pattern(self.tag, head))
        if n >= 2 * 4096:
            self.space.write(a, pattern(self.tag + 1 << 32, 4096), offset=n - 4096)
        return self.tag

    def check(self, a: int) -> None:
        n, tag, _ = self.live[a]
        assert self.space.read(a, min(n, 4096)) == pattern(tag, min(n, 4096))
        if n >= 2 * 4096:
            assert self.space.read(a, 4096, offset=n - 4096) == pattern(tag + 1 << 32, 4096)

    # Sizes that share pages with their neighbours (everything not a whole number of pages) and
    # sizes that do not: eviction moves a shared page whole, only when all on it may move.
    @rule(n=st.sampled_from([100, 512, 40_000, 1536 * 1024, 2 * MiB, 2 * MiB + 1, 3 * MiB, 4 * MiB, 6 * MiB]),
          evictable=st.booleans())
    def malloc(self, n, evictable):
        try:
            a = self.space.malloc(n)
        except OutOfMemoryError:
            return
        self.live[a] = (n, self.write(a, n), evictable)
        if evictable:
            self.space.set_evictable(a)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        a = data.draw(st.sampled_from(list(self.live)))
        self.check(a)
        self.space.free(a)
        del self.live[a]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def offload(self, data):
        a = data.draw(st.sampled_from(list(self.live)))
        try:
            self.space.offload(a)
        except InvalidArgumentError:
            pass  # shares a page with a pinned allocation

    @precondition(lambda self: self.live)
    @rule(data=st.data(), wait=st.booleans())
    def restore(self, data, wait):
        a = data.draw(st.sampled_from(list(self.live)))
        try:
            self.space.ensure_resident(a) if wait else self.space.prefetch(a)
        except OutOfMemoryError:
            return
        if wait:
            assert self.space.residency(a) == "resident"

    @precondition(lambda self: self.live)
    @rule(data=st.data(), flag=st.booleans())
    def evictable(self, data, flag):
        a = data.draw(st.sampled_from(list(self.live)))
        n, tag, _ = self.live[a]
        try:
            self.space.set_evictable(a, flag)
        except OutOfMemoryError:
            assert not flag  # making it resident needs a page
            return
        self.live[a] = (n, tag, flag)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def rewrite(self, data):
        a = data.draw(st.sampled_from(list(self.live)))
        n, _, ev = self.live[a]
        self.live[a] = (n, self.write(a, n), ev)  # reaches evicted bytes without restoring

    @invariant()
    def bytes_intact(self):
        for a in self.live:
            self.check(a)

    @invariant()
    def consistent(self):
        s = self.space.stats()
        assert s.num_live_allocs == len(self.live)
        assert s.mapped_bytes <= s.capacity_bytes
        # A page being filled during a mapped-mode restore is neither mapped nor free yet.
        assert 0 <= s.pages_total - s.pages_mapped - s.pages_free <= s.pages_in_flight
        assert s.host_pool_used_bytes >= s.pages_evicted * s.page_bytes
        for a in self.live:
            assert self.space.residency(a) in ("resident", "evicted", "in_flight")



class CopyModeMachine(EvictionMachine):
    mode = "copy"


# Extents of at most 4 MiB (two pages), from 4 MiB up: 2 MiB + 1 and 4 MiB get one, 6 MiB gets
# one and a one-page handle, so handles of mixed sizes are evicted, restored and traded.
class ExtentMachine(EvictionMachine):
    extent_size = "4MiB"


class CopyModeExtentMachine(EvictionMachine):
    mode = "copy"
    extent_size = "4MiB"


_SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestEvictionMachineMapped = EvictionMachine.TestCase
TestEvictionMachineMapped.settings = _SETTINGS
TestEvictionMachineCopy = CopyModeMachine.TestCase
TestEvictionMachineCopy.settings = _SETTINGS
TestEvictionMachineExtents = ExtentMachine.TestCase
TestEvictionMachineExtents.settings = _SETTINGS
TestEvictionMachineCopyExtents = CopyModeExtentMachine.TestCase
TestEvictionMachineCopyExtents.settings = _SETTINGS
