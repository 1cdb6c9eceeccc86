"""Backend conformance: the same checks over every backend (cuda marked gpu).

Two levels: the driver-seam contract run inside the library (backend.hpp's rules, so the
host backend is held to CUDA's), and the AddressSpace API over each backend.
"""

from __future__ import annotations

import pytest

from vtalloc.allocator import AddressSpace, _native
from helpers.spaces import MiB, pattern

BACKENDS = [pytest.param("host", id="host"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_driver_seam_contract(backend):
    failures, report = _native.backend_conformance(backend)
    assert failures == 0, report


@pytest.mark.parametrize("backend", BACKENDS)
def test_bytes_round_trip_at_every_size_class(backend):
    with AddressSpace(backend=backend, capacity=64 * MiB) as space:
        sizes = [1, 511, 512, 4096, 100_000, MiB, MiB + 1, 2 * MiB, 5 * MiB + 123]
        addrs = [space.malloc(n) for n in sizes]
        for i, (a, n) in enumerate(zip(addrs, sizes)):
            space.write(a, pattern(i, n))
        for i, (a, n) in enumerate(zip(addrs, sizes)):
            assert space.read(a, n) == pattern(i, n)
            assert space.size_of(a) == n
        for a in addrs:
            space.free(a)
        assert space.stats().allocated_bytes == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_alignment(backend):
    with AddressSpace(backend=backend, capacity=64 * MiB) as space:
        page = space.page_bytes
        small = [space.malloc(n) for n in (1, 700, 4097, 65536)]
        large = [space.malloc(n) for n in (page, page + 1, 3 * page)]
        assert all(a % 512 == 0 for a in small)
        assert all(a % page == 0 for a in large)
        for a in small + large:
            space.free(a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_small_allocations_share_pages(backend):
    with AddressSpace(backend=backend, capacity=64 * MiB) as space:
        addrs = [space.malloc(512) for _ in range(1000)]
        s = space.stats()
        assert s.pages_mapped == 1, "1000 x 512 B fit in one 2 MiB page"
        assert s.active_bytes == 512 * 1000
        for a in addrs:
            space.free(a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stats_track_allocations(backend):
    with AddressSpace(backend=backend, capacity=64 * MiB) as space:
        page = space.page_bytes
        a = space.malloc(3 * MiB)
        b = space.malloc(100)
        s = space.stats()
        assert s.allocated_bytes == 3 * MiB + 100
        assert s.active_bytes == 2 * page + 512
        assert s.mapped_bytes == 3 * page
        assert (s.num_allocs, s.num_frees, s.num_live_allocs) == (2, 0, 2)
        space.free(a)
        space.free(b)
        s = space.stats()
        assert s.allocated_bytes == 0 and s.active_bytes == 0
        assert s.peak_allocated_bytes == 3 * MiB + 100
        assert s.cached_bytes == s.mapped_bytes, "freed pages stay mapped for fast reuse"
        space.reset_peak_stats()
        assert space.stats().peak_allocated_bytes == 0
