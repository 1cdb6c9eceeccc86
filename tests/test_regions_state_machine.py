"""Regions under random interleavings (hypothesis state machines, both eviction modes): tag,
allocate, write, pause (with and without discard), resume, free, and pressure from allocations
outside the regions, some marked evictable.

What must hold after every step: an allocation that is not paused reads back what was last written
(a discarded one, once resumed, holds nothing promised until written again); a paused one refuses
to be read or written and reports "paused"; addresses never change; a region's paused bytes are
exactly its paused allocations' bytes; the pages held never exceed the capacity, nor the host
bytes used the host pool; a pause or resume that fails (host pool full, no room) changes nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)
from helpers.sizes import MiB
from helpers.spaces import pattern

from vtalloc.allocator import AddressSpace, HostPoolExhaustedError, OutOfMemoryError, PausedError

TAGS = ["a", "b", None]
SIZES = [3000, 100_000, 700_000, 2 * MiB, 3 * MiB + 5, 9 * MiB]
CAPACITY, HOST = 24 * MiB, 32 * MiB


def rounded(n: int) -> int:
    return -(-n // 512) * 512


class RegionMachine(RuleBasedStateMachine):
    evict_mode = "copy"
    allocations = Bundle("allocations")

    def __init__(self):
        super().__init__()
        # Extents from 4 pages up, so regions move extents and one-page handles alike.
        self.space = AddressSpace(backend="host", capacity=CAPACITY, host_capacity=HOST, evict_mode=self.evict_mode,
                                  extent_size=8 * MiB)
        self.live: dict[int, dict] = {}  # address -> size, tag, seed (None: unknown), paused
        self.seeds = iter(range(1, 1 << 30))

    def _write(self, a: int) -> None:
        seed = next(self.seeds)
        self.space.write(a, pattern(seed, self.live[a]["size"]))
        self.live[a]["seed"] = seed

    @rule(target=allocations, tag=st.sampled_from(TAGS), size=st.sampled_from(SIZES), evictable=st.booleans())
    def malloc(self, tag, size, evictable):
        try:
            if tag is None:
                a = self.space.malloc(size)
            else:
                with self.space.region(tag):
                    a = self.space.malloc(size)
        except OutOfMemoryError:
            return None
        self.live[a] = {"size": size, "tag": tag, "seed": None, "paused": False}
        self._write(a)
        if tag is None and evictable:
            self.space.set_evictable(a)  # pressure (a resume included) may evict it
        return a

    @initialize(target=allocations, tag=st.sampled_from(TAGS[:2]), size=st.sampled_from(SIZES))
    def a_region_to_begin_with(self, tag, size):
        return self.malloc(tag, size, False)

    @rule(a=allocations)
    def write(self, a):
        if a is None or a not in self.live:
            return
        if self.live[a]["paused"]:
            with pytest.raises(PausedError):
                self.space.write(a, b"x")
            return
        self._write(a)

    @rule(a=consumes(allocations))
    def free(self, a):
        if a is None or a not in self.live:
            return
        self.space.free(a)
        del self.live[a]

    @rule(tag=st.sampled_from(TAGS[:2]), discard=st.booleans())
    def pause(self, tag, discard):
        try:
            moved = self.space.pause(tag, discard=discard)
        except HostPoolExhaustedError:
            event("pause refused: host pool full")
            return  # nothing moved: the model stays as it is
        event(f"pause moved pages: {moved > 0}")
        for v in self.live.values():
            if v["tag"] == tag:
                if discard:
                    v["seed"] = None
                v["paused"] = True

    @rule(tag=st.sampled_from(TAGS[:2]))
    def resume(self, tag):
        try:
            moved = self.space.resume(tag)
        except OutOfMemoryError:
            event("resume refused: no room")
            return  # all or nothing: still paused
        event(f"resume moved pages: {moved > 0}")
        for v in self.live.values():
            if v["tag"] == tag:
                v["paused"] = False

    @precondition(lambda self: any(v["paused"] for v in self.live.values()))
    @rule(data=st.data())
    def resume_a_paused_region(self, data):
        self.resume(data.draw(st.sampled_from(sorted({v["tag"] for v in self.live.values() if v["paused"]}))))

    @precondition(lambda self: any(v["paused"] for v in self.live.values()))
    @rule(target=allocations, size=st.sampled_from([12 * MiB, 20 * MiB]), evictable=st.booleans())
    def fill_the_room_a_pause_left(self, size, evictable):
        """An allocation outside the regions, in the pages a pause left: a later resume must evict
        it (evictable) or fail (not), all or nothing."""
        a = self.malloc(None, size, evictable)
        event(f"filled the room a pause left: {a is not None}")
        return a

    @invariant()
    def bytes_and_states(self):
        for a, v in self.live.items():
            if v["paused"]:
                assert self.space.residency(a) == "paused"
                with pytest.raises(PausedError):
                    self.space.read(a, 1)
            elif v["seed"] is not None:
                assert self.space.read(a, v["size"]) == pattern(v["seed"], v["size"]), hex(a)

    @invariant()
    def addresses_and_accounting(self):
        assert sorted(r.address for r in self.space.allocations()) == sorted(self.live)
        rows = {r.tag: r for r in self.space.regions()}
        for tag in TAGS[:2]:
            paused = sum(rounded(v["size"]) for v in self.live.values() if v["tag"] == tag and v["paused"])
            assert (rows[tag].paused_bytes if tag in rows else 0) == paused, tag
        s = self.space.stats()
        assert s.pages_total * s.page_bytes <= CAPACITY
        assert s.host_pool_used_bytes <= HOST

    def teardown(self):
        for tag in TAGS[:2]:
            try:
                self.space.resume(tag)
            except OutOfMemoryError:
                pass
        for a in list(self.live):
            self.space.free(a)
        assert self.space.stats().host_pool_used_bytes == 0
        self.space.close()


class MappedRegionMachine(RegionMachine):
    evict_mode = "mapped"


_settings = settings(max_examples=30, stateful_step_count=25, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
TestRegionsCopyMode = RegionMachine.TestCase
TestRegionsCopyMode.settings = _settings
TestRegionsMappedMode = MappedRegionMachine.TestCase
TestRegionsMappedMode.settings = _settings
