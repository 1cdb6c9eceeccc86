"""Property test: random malloc / free / write / read / trim against a model.

After every step: every live allocation reads back exactly what was last written to it,
allocations never overlap, every page they touch is mapped, mapped bytes never exceed
capacity, the stats agree with the model, and an OOM happens only when the pages that live
allocations touch plus the pages the request needs exceed capacity (invariant 1: no
fragmentation OOM; pages are shared between neighbouring allocations, so "the pages they touch"
is the model's count, not their rounded sizes; an extent that blocks use only in part counts
only its touched pages, since the space splits it at the edge of an OOM). A third machine uses
extents of up to 16 MiB in a 32 MiB space, so that blocks share extents' pages.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule

from vtalloc.allocator import OutOfMemoryError
from helpers.spaces import MiB, PAGE, host_space, pattern

CAPACITY = 16 * MiB
SMALL = MiB

SIZES = st.one_of(
    st.integers(1, 4096),
    st.integers(4097, SMALL),
    st.integers(SMALL + 1, 3 * PAGE),
    st.sampled_from([PAGE, 2 * PAGE, 4 * PAGE, 8 * PAGE]),
)


def rounded(n: int) -> int:
    return -(-n // 512) * 512


def pages_of(a: int, n: int) -> range:
    return range(a // PAGE, (a + rounded(n) - 1) // PAGE + 1)


class SpaceMachine(RuleBasedStateMachine):
    allocations = Bundle("allocations")
    extent_size: str | None = None
    capacity = CAPACITY

    def __init__(self) -> None:
        super().__init__()
        self.space = host_space(self.capacity, extent_size=self.extent_size)
        self.live: dict[int, tuple[int, int]] = {}  # address -> (size, tag)
        self.tag = 0

    def teardown(self) -> None:
        for a in list(self.live):
            self.space.free(a)
        self.space.close()

    def touched_pages(self) -> set[int]:
        return {p for a, (n, _) in self.live.items() for p in pages_of(a, n)}

    @rule(target=allocations, n=SIZES)
    def malloc(self, n):
        try:
            a = self.space.malloc(n)
        except OutOfMemoryError:
            # Allowed only if the pages live allocations touch plus a fresh placement exceed capacity.
            need = -(-n // PAGE)
            assert len(self.touched_pages()) + need > self.capacity // PAGE, "fragmentation OOM"
            return None
        assert a % 512 == 0
        self.tag += 1
        self.write_tagged(a, n, self.tag)
        self.live[a] = (n, self.tag)
        return a

    @rule(a=consumes(allocations))
    def free(self, a):
        if a is None or a not in self.live:
            return
        self.check_bytes(a)
        self.space.free(a)
        del self.live[a]

    @rule(a=allocations)
    def rewrite(self, a):
        if a is None or a not in self.live:
            return
        n, _ = self.live[a]
        self.tag += 1
        self.write_tagged(a, n, self.tag)
        self.live[a] = (n, self.tag)

    @precondition(lambda self: self.live)
    @rule()
    def trim(self):
        self.space.trim()

    # Head (up to 8 KiB) and, for larger allocations, the last 64 bytes carry the tag.
    def write_tagged(self, a: int, n: int, tag: int) -> None:
        self.space.write(a, pattern(tag, min(n, 8192)))
        if n >= 8192 + 64:
            self.space.write(a, pattern(-tag % (1 << 63), 64), offset=n - 64)

    def check_bytes(self, a: int) -> None:
        n, tag = self.live[a]
        assert self.space.read(a, min(n, 8192)) == pattern(tag, min(n, 8192))
        if n >= 8192 + 64:
            assert self.space.read(a, 64, offset=n - 64) == pattern(-tag % (1 << 63), 64)

    @invariant()
    def bytes_intact_and_accounting_exact(self):
        for a in self.live:
            self.check_bytes(a)
        s = self.space.stats()
        assert s.mapped_bytes <= s.capacity_bytes
        assert s.num_live_allocs == len(self.live)
        assert s.allocated_bytes == sum(n for n, _ in self.live.values())
        assert s.active_bytes == sum(rounded(n) for n, _ in self.live.values())
        assert s.pages_mapped + s.pages_free == s.pages_total
        spans = sorted((a, a + rounded(n)) for a, (n, _) in self.live.items())
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start, "allocations overlap"
        states = {r.address // PAGE: r.state for r in self.space.pages() if r.address is not None}
        assert all(states.get(p) == "allocated" for p in self.touched_pages()), "a page under live data is not mapped"


TestSpaceMachine = SpaceMachine.TestCase
TestSpaceMachine.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class ExtentSpaceMachine(SpaceMachine):
    """The same with extents of at most 4 MiB from 4 MiB up: handles of mixed sizes, and still no
    fragmentation OOM (a cached extent gives its bytes to pages and the reverse)."""

    extent_size = "4MiB"


TestExtentSpaceMachine = ExtentSpaceMachine.TestCase
TestExtentSpaceMachine.settings = TestSpaceMachine.settings


class LargeExtentSpaceMachine(SpaceMachine):
    """Extents of up to 16 MiB in a 32 MiB space: a block may reuse part of a cached extent, and
    smaller ones then fill the rest of it; still no OOM while the pages live data touches leave
    room (an extent used in part is split: its blocks' pages move to handles of their own)."""

    extent_size = "16MiB"
    capacity = 32 * MiB


TestLargeExtentSpaceMachine = LargeExtentSpaceMachine.TestCase
TestLargeExtentSpaceMachine.settings = TestSpaceMachine.settings
