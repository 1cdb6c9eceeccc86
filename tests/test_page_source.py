"""The lease path one way: the core reports a shortage to its page source without counting an OOM.

Owns: checks of the try flags (VTA_MALLOC_TRY, vta_restore's VTA_RESTORE_TRY) and of a leased
space over a page source made here (pages from a local PagePool): a shortage the source answers
is no OOM in the core's own counters (read straight from vta_stats, not through Python), a
malloc the source cannot serve counts exactly one; ServiceAddressSpace holds a space rather
than being one (its use over a daemon is tests/test_service_*.py's).
Invariants: every page a source imported goes back to its pool before the test ends.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
from helpers.sizes import MiB, PAGE
from helpers.spaces import lease

from vtalloc.allocator import AddressSpace, OutOfMemoryError, PagePool, Stats
from vtalloc.allocator import _native
from vtalloc.allocator.errors import Status
from vtalloc.allocator.page_source import PageSource


def core_stats(space: AddressSpace) -> Stats:
    """The core's counters as vta_stats reports them (nothing adjusted in Python)."""
    raw = _native.VtaStats()
    _native.check(space._lib.vta_stats(space._h(), ctypes.byref(raw)))
    return _native.stats_from_struct(raw)


class PoolSource(PageSource):
    """A page source over a local PagePool: one page per shortage, ``limit`` pages in all."""

    def __init__(self, pool: PagePool, limit: int) -> None:
        self.pool, self.limit, self.held, self.shortages = pool, limit, [], 0

    def on_shortage(self, space: Any, nbytes: int, *, restore: bool) -> bool:
        self.shortages += 1
        if len(self.held) >= self.limit:
            return False
        self.held += lease(self.pool, space, 1)
        return True

    def after_free(self, space: Any, address: int) -> None:
        pass

    def trim(self, space: Any) -> int:
        tags = space.return_pages(len(self.held))
        for tag in tags:
            self.held.remove(tag)
            self.pool.release_page(tag)
        return len(tags) * space.page_bytes

    def close(self) -> None:
        for pid in self.held:
            self.pool.release_page(pid)
        self.held = []


def test_a_try_reports_a_shortage_without_counting_an_oom():
    with AddressSpace(backend="host", capacity=8 * MiB, leased=True) as space:
        out = ctypes.c_uint64()
        lib, h = space._lib, space._h()
        status = lib.vta_malloc_ex(h, PAGE, 0, _native.MALLOC_TRY, ctypes.byref(out))
        assert status == Status.OUT_OF_MEMORY and core_stats(space).num_ooms == 0
        status = lib.vta_malloc_ex(h, PAGE, 0, _native.MALLOC_TRY | _native.MALLOC_NO_EVICT, ctypes.byref(out))
        assert status == Status.OUT_OF_MEMORY and core_stats(space).num_ooms == 0
        assert lib.vta_malloc_ex(h, PAGE, 0, 0, ctypes.byref(out)) == Status.OUT_OF_MEMORY
        assert core_stats(space).num_ooms == 1  # not a try: counted
        # over capacity is an OOM whatever the flags: no page source can help
        assert lib.vta_malloc_ex(h, 16 * MiB, 0, _native.MALLOC_TRY, ctypes.byref(out)) == Status.OUT_OF_MEMORY
        assert core_stats(space).num_ooms == 2
        assert lib.vta_malloc_ex(h, PAGE, 0, 4, ctypes.byref(out)) == Status.INVALID_ARGUMENT  # unknown flag
        assert lib.vta_restore(h, 0x1000, 0, 0, 4) == Status.INVALID_ARGUMENT


def test_a_shortage_the_source_answers_is_no_oom_in_the_core():
    with PagePool(backend="host", capacity=8 * MiB) as pool:
        source = PoolSource(pool, limit=2)
        with AddressSpace(backend="host", capacity=8 * MiB, leased=True, page_source=source) as space:
            a = space.malloc(2 * PAGE)  # two shortages, each answered with a page
            assert source.shortages == 2 and len(source.held) == 2
            assert core_stats(space).num_ooms == 0 == space.stats().num_ooms
            with pytest.raises(OutOfMemoryError):
                space.malloc(PAGE, evict=False)  # the source has no more: the last try counts one
            assert core_stats(space).num_ooms == 1 == space.stats().num_ooms
            space.free(a)
            space.synchronize()
            assert space.trim() == 2 * PAGE and source.held == []
        assert pool.info().pages_held == 0


def test_a_restore_short_of_pages_asks_the_source_and_counts_no_oom():
    with PagePool(backend="host", capacity=8 * MiB) as pool:
        source = PoolSource(pool, limit=1)
        with AddressSpace(backend="host", capacity=8 * MiB, leased=True, page_source=source) as space:
            a = space.malloc(PAGE)
            space.write(a, b"kept")
            space.set_evictable(a)
            space.offload(a)
            space.synchronize()
            space.release_offloaded()
            assert space.trim() == PAGE and source.held == []  # no device page left in the space
            space.ensure_resident(a)  # a try short of pages, the source's page, a last try that succeeds
            assert space.read(a, 4) == b"kept"
            assert core_stats(space).num_ooms == 0 == space.stats().num_ooms
            space.free(a)
        assert pool.info().pages_held == 0


def test_the_service_space_holds_an_address_space():
    from vtalloc.client.service_space import ServiceAddressSpace

    assert not issubclass(ServiceAddressSpace, AddressSpace)  # a composition (the space and the lease)
    public = {n for n in dir(AddressSpace) if not n.startswith("_")}
    own = {n for n in vars(ServiceAddressSpace) if not n.startswith("_")}
    assert {"space", "lease", "give_back", "session", "report", "evictable_addresses"} <= own
    assert "malloc" in public and not own & (public - {"close", "closed", "page_source"})
