"""The service's building blocks in the core: a page pool that exports pages as file
descriptors, and a leased address space that maps only imported pages."""

from __future__ import annotations

import os

import pytest

from vtalloc.allocator import AddressSpace, InvalidArgumentError, OutOfMemoryError, PagePool
from helpers.spaces import MiB, lease, pattern


def test_leased_space_maps_only_imported_pages():
    with PagePool(backend="host", capacity=16 * MiB) as pool, \
            AddressSpace(backend="host", capacity=16 * MiB, leased=True) as space:
        with pytest.raises(OutOfMemoryError):
            space.malloc(4096)  # nothing leased yet
        ids = lease(pool, space, 3)
        assert sorted(p.tag for p in space.pages()) == sorted(ids)  # each page carries its lease id
        a = space.malloc(4 * MiB)
        b = space.malloc(1000)
        space.write(a, pattern(1, 4 * MiB))
        with pytest.raises(OutOfMemoryError):
            space.malloc(2 * MiB)
        assert space.return_pages(5) == []  # every page holds live data
        space.free(b)
        returned = space.return_pages(5)
        assert len(returned) == 1 and returned[0] in ids
        assert space.read(a, 4 * MiB) == pattern(1, 4 * MiB)
        space.free(a)
        returned += space.return_pages(5)
        assert sorted(returned) == sorted(ids)
        assert space.stats().pages_total == 0
        for pid in ids:
            pool.release_page(pid)
        assert pool.info().pages_held == 0


def test_two_spaces_share_one_page():
    with PagePool(backend="host", capacity=4 * MiB) as pool, \
            AddressSpace(backend="host", capacity=4 * MiB, leased=True) as s1, \
            AddressSpace(backend="host", capacity=4 * MiB, leased=True) as s2:
        pid = pool.create_page()
        for s in (s1, s2):
            fd = pool.export_page(pid)
            s.import_page(fd, pid)
            os.close(fd)
        a1, a2 = s1.malloc(2 * MiB), s2.malloc(2 * MiB)
        s1.write(a1, b"shared bytes")
        assert s2.read(a2, 12) == b"shared bytes"
        s1.free(a1)
        s2.free(a2)
        assert s1.return_pages(1) == [pid] and s2.return_pages(1) == [pid]
        pool.release_page(pid)


def test_pool_errors():
    with PagePool(backend="host", capacity=4 * MiB) as pool:
        pool.create_page()
        pool.create_page()
        with pytest.raises(OutOfMemoryError):
            pool.create_page()
        for bad in (0, 999, -1, "x"):
            with pytest.raises(InvalidArgumentError):
                pool.export_page(bad)
            with pytest.raises(InvalidArgumentError):
                pool.release_page(bad)
    with AddressSpace(backend="host", capacity=4 * MiB) as plain:
        with pytest.raises(InvalidArgumentError):
            plain.import_page(0, 1)
    with AddressSpace(backend="host", capacity=2 * MiB, leased=True) as space:
        r, w = os.pipe()
        try:
            with pytest.raises(InvalidArgumentError):
                space.import_page(r, 1)  # not a page
        finally:
            os.close(r)
            os.close(w)
        with pytest.raises(InvalidArgumentError):
            space.import_page(-1, 1)
    with pytest.raises(InvalidArgumentError):
        AddressSpace(backend="host", leased=True)  # a lease needs a ceiling
