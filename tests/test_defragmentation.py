"""Invariant 1: no fragmentation OOM. Freed pages under cached ranges are remapped, so an
allocation fails only when live allocations plus the request exceed capacity."""

from __future__ import annotations

import pytest

from vtalloc.allocator import OutOfMemoryError
from helpers.spaces import MiB, host_space, pattern


def test_checkerboard_then_one_big_allocation():
    with host_space(64 * MiB) as space:
        page = space.page_bytes
        addrs = [space.malloc(2 * MiB) for _ in range(32)]
        for i, a in enumerate(addrs):
            space.write(a, pattern(i, 2 * MiB))
        for a in addrs[::2]:
            space.free(a)
        assert space.stats().mapped_bytes == 64 * MiB  # at capacity: every hole still mapped
        big = space.malloc(32 * MiB)
        assert big % page == 0
        s = space.stats()
        assert s.num_page_reclaims == 16
        assert s.mapped_bytes <= s.capacity_bytes
        for i in range(1, 32, 2):
            assert space.read(addrs[i], 2 * MiB) == pattern(i, 2 * MiB)
        space.write(big, pattern(99, 32 * MiB))
        assert space.read(big, 32 * MiB) == pattern(99, 32 * MiB)
        for i in range(1, 32, 2):  # the big allocation did not overwrite a survivor
            assert space.read(addrs[i], 64) == pattern(i, 64)


def test_fails_only_when_live_bytes_plus_request_exceed_capacity():
    with host_space(16 * MiB) as space:
        live = [space.malloc(2 * MiB) for _ in range(8)]
        for a in live[1::2]:
            space.free(a)
        # 4 pages live, 4 cached: 8 MiB fits, 10 MiB does not.
        with pytest.raises(OutOfMemoryError) as exc:
            space.malloc(10 * MiB)
        assert exc.value.requested_bytes == 10 * MiB
        assert exc.value.capacity_bytes == 16 * MiB
        assert space.stats().num_ooms == 1
        big = space.malloc(8 * MiB)
        space.free(big)
        for a in live[0::2]:
            space.free(a)


def test_oom_changes_nothing():
    with host_space(8 * MiB) as space:
        a = space.malloc(6 * MiB)
        space.write(a, pattern(1, 6 * MiB))
        before = space.stats()
        with pytest.raises(MemoryError):
            space.malloc(4 * MiB)
        after = space.stats()
        assert after.num_ooms == before.num_ooms + 1
        assert (after.allocated_bytes, after.mapped_bytes, after.num_live_allocs) == (
            before.allocated_bytes, before.mapped_bytes, before.num_live_allocs)
        assert space.read(a, 6 * MiB) == pattern(1, 6 * MiB)
        space.free(a)


def test_pages_of_small_blocks_are_reclaimed_for_large_allocations():
    with host_space(8 * MiB) as space:
        smalls = [space.malloc(64 * 1024) for _ in range(4 * 32)]  # fill 4 pages with 64 KiB blocks
        assert space.stats().pages_mapped == 4
        for a in smalls:
            space.free(a)
        big = space.malloc(8 * MiB)  # every page, including those the small blocks emptied
        assert space.stats().pages_mapped == 4
        space.free(big)


def test_trim_releases_cached_pages():
    with host_space(16 * MiB) as space:
        addrs = [space.malloc(2 * MiB) for _ in range(4)]
        for a in addrs:
            space.free(a)
        assert space.stats().cached_bytes == 8 * MiB
        assert space.trim() == 8 * MiB
        s = space.stats()
        assert (s.mapped_bytes, s.pages_total, s.cached_bytes) == (0, 0, 0)


def test_va_grows_with_new_reservations():
    with host_space(16 * MiB, reservation_size=8 * MiB) as space:
        a = space.malloc(6 * MiB)
        b = space.malloc(6 * MiB)  # does not fit in the first 8 MiB reservation
        s = space.stats()
        assert s.num_reservations == 2
        assert s.reserved_va_bytes == 16 * MiB
        space.free(a)
        space.free(b)
