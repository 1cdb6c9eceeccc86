"""A service-backed space restores evicted allocations onto newly leased pages while the
node has free pages, and evicts its own only when the node (or its quota) has none
(issue 11, finding 10).

test_after_pressure_restores_lease_free_node_pages_before_evicting_their_own failed before
its fix: 16 allocations of 8 MiB touched in turn after a pressure episode made the space
evict its own least recently used pages for every restore (60 self-evictions, 1 of 16
resident), although the node had every page free again.
"""

from __future__ import annotations

from helpers.service import ClientProc, Daemon
from helpers.spaces import MiB, pattern

from vtalloc.client import ServiceAddressSpace

N, SIZE = 16, 8 * MiB


def test_after_pressure_restores_lease_free_node_pages_before_evicting_their_own():
    with Daemon(capacity="160MiB", args=("--default-quota", "0:1GiB"), evict_deadline=2.0) as d, \
            ServiceAddressSpace(d.address, lease_batch_pages=4, keep_free_pages=0, report_interval_s=0.05) as a:
        addrs = [a.malloc(SIZE) for _ in range(N)]
        for i, x in enumerate(addrs):
            a.write(x, pattern(i, SIZE))
            a.set_evictable(x)
        with ClientProc() as b:                       # the pressure episode: b needs 64 MiB a holds
            b.ok("open", address=d.address, batch=1)
            b.ok("malloc", nbytes=96 * MiB, seed=99)
            assert a.stats().pages_evicted > 0
        # b is gone: the node has its pages free again. Touch every allocation, four rounds.
        before = a.stats()
        for _ in range(4):
            for i, x in enumerate(addrs):
                a.ensure_resident(x)
                assert a.read(x, 4096) == pattern(i, 4096)
        after = a.stats()
        self_evictions = after.evictions - before.evictions
        resident = sum(a.residency(x) == "resident" for x in addrs)
        assert (self_evictions, resident) == (0, N), (self_evictions, resident, after.pages_total)
        assert all(a.read(x, SIZE) == pattern(i, SIZE) for i, x in enumerate(addrs))


def test_when_the_node_has_no_free_page_a_restore_still_evicts_the_spaces_own():
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB"), evict_deadline=0.2) as d, \
            ServiceAddressSpace(d.address, lease_batch_pages=4, keep_free_pages=0, report_interval_s=0.05) as a, \
            ClientProc() as b:
        addrs = [a.malloc(SIZE) for _ in range(4)]    # the whole node
        for i, x in enumerate(addrs):
            a.write(x, pattern(i, SIZE))
            a.set_evictable(x)
        b.ok("open", address=d.address, batch=1)
        kept = b.ok("malloc", nbytes=16 * MiB, seed=7)["addr"]  # a offloads two; b keeps its pages
        evicted = [x for x in addrs if a.residency(x) == "evicted"]
        assert len(evicted) == 2
        before = a.stats().evictions
        for x in evicted:                               # the node is short: a makes room itself
            a.ensure_resident(x)
        assert a.stats().evictions > before
        assert sum(a.residency(x) == "resident" for x in addrs) == 2
        assert all(a.read(x, SIZE) == pattern(i, SIZE) for i, x in enumerate(addrs))
        assert b.ok("check", addr=kept, nbytes=16 * MiB, seed=7)["intact"]
