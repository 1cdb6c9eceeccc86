"""What a free costs the eviction engine's LRU while allocations are evictable.

Owns: the check that freeing an evictable allocation touches a bounded number of LRU entries
whatever its size (the LRU stores runs of pages, and a free forgets the pages only it covered
in one step: csrc/evict/lru_policy.hpp), and that the least-recently-used order around such a
free is the one a list of pages would give.
Invariants: counts, not timings (AddressSpace._victim_counters), so a loaded machine cannot
make them flake; every space is on the host backend and freed empty (the zero-leak fixture).
"""

from __future__ import annotations

import pytest

from vtalloc.allocator import AddressSpace
from helpers.spaces import MiB, PAGE


def free_cost(size: int) -> tuple[int, int, int]:
    """Candidates before and after freeing an evictable allocation of `size` beside another
    evictable one, and the LRU entries that free touched."""
    with AddressSpace(backend="host", capacity=size + 4 * PAGE) as s:
        other = s.malloc(PAGE)
        s.set_evictable(other)
        a = s.malloc(size)
        s.set_evictable(a)
        before, touched = s._victim_counters()
        s.free(a)
        after, touched_after = s._victim_counters()
        s.free(other)
        assert s._victim_counters()[0] == 0  # no live allocation: no candidate left
        return before, after, touched_after - touched


@pytest.mark.parametrize("size", [2 * MiB, 64 * MiB, 512 * MiB])
def test_free_of_an_evictable_allocation_touches_few_lru_entries(size):
    """The old free walked every page (note_use over the allocation): 256 entries at 512 MiB
    of 2 MiB pages. Now its first and last pages and one cut run, whatever the size."""
    before, after, touched = free_cost(size)
    assert (before, after) == (size // PAGE + 1, 1)  # every page of both, then only `other`'s
    assert touched <= 3, f"a free of {size} bytes touched {touched} LRU entries"


def test_free_cost_does_not_grow_with_the_allocation():
    """The same entries at 8, 64 and 512 MiB (4, 32 and 256 pages; the old walk: one each)."""
    costs = [free_cost(size)[2] for size in (8 * MiB, 64 * MiB, 512 * MiB)]
    assert costs == [costs[0]] * 3, costs


@pytest.mark.parametrize("mode", ["mapped", "copy"])
def test_lru_order_holds_around_a_free_inside_a_run(mode):
    """p, q, r on pages of their own, made evictable in that order: one run [p, q, r] in the
    LRU. Freeing q cuts the run; pressure then evicts p before r, as a list of pages would."""
    with AddressSpace(backend="host", capacity=4 * PAGE, host_capacity=8 * PAGE, evict_mode=mode,
                      extent_size=PAGE) as s:
        p, q, r = (s.malloc(PAGE) for _ in range(3))
        for a in (p, q, r):
            s.set_evictable(a)
        assert s._victim_counters()[0] == 3
        s.free(q)
        assert s._victim_counters()[0] == 2
        fillers = [s.malloc(PAGE) for _ in range(2)]  # q's page and the last free one: no eviction
        assert (s.residency(p), s.residency(r)) == ("resident", "resident")
        fillers.append(s.malloc(PAGE))  # the least recently used goes: p
        assert (s.residency(p), s.residency(r)) == ("evicted", "resident")
        fillers.append(s.malloc(PAGE))  # then r
        assert (s.residency(p), s.residency(r)) == ("evicted", "evicted")
        assert s._victim_counters()[0] == 0
        for a in (p, r, *fillers):
            s.free(a)
