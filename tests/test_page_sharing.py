"""Pages shared between allocations (docs/design.md, "Blocks share pages"): every allocation is
a 512-byte-aligned block, and a page is held by every block that touches it. What it must show:
medium tensors map their bytes, not whole pages each; a freed block's pages are cached only when
no other block touches them, and are then reclaimed for any allocation (no fragmentation OOM);
a cached extent is reused by a block that covers most of it, with no driver call, and never
pinned by a block that would use only a little of it; eviction moves a shared page whole, only
when every allocation on it may move, and loses no byte of either neighbour."""

from __future__ import annotations

import pytest

from helpers.sizes import PAGE
from helpers.spaces import MiB, host_space, pattern
from vtalloc.allocator import InvalidArgumentError, OutOfMemoryError


def test_medium_allocations_map_their_bytes_not_whole_pages():
    with host_space(256 * MiB) as space:
        addrs = [space.malloc(3 * MiB) for _ in range(64)]
        s = space.stats()
        assert s.active_bytes == 64 * 3 * MiB
        assert s.mapped_bytes == 64 * 3 * MiB  # 96 pages; whole-page rounding would map 128
        for i, a in enumerate(addrs):
            space.write(a, pattern(i, 3 * MiB))
        for i, a in enumerate(addrs):
            assert space.read(a, 3 * MiB) == pattern(i, 3 * MiB)
        for a in addrs:
            space.free(a)


def test_neighbours_share_a_page_and_keep_their_bytes():
    with host_space(16 * MiB) as space:
        a = space.malloc(3 * MiB)
        b = space.malloc(MiB)
        assert b == a + 3 * MiB and space.stats().mapped_bytes == 2 * PAGE
        space.write(a, pattern(1, 3 * MiB))
        space.write(b, pattern(2, MiB))
        assert space.read(a, 3 * MiB) == pattern(1, 3 * MiB) and space.read(b, MiB) == pattern(2, MiB)
        space.free(a)
        s = space.stats()
        assert s.cached_bytes == PAGE  # a's first page: nothing else touches it
        assert {r.state for r in space.pages() if r.address == a - a % PAGE + PAGE} == {"allocated"}  # b's
        assert space.read(b, MiB) == pattern(2, MiB)
        space.free(b)
        assert space.stats().cached_bytes == 2 * PAGE


def test_freed_pages_back_any_allocation_while_shared_ones_stay():
    # 5 x 3 MiB fill 8 pages of a 16 MiB space; freeing every other one leaves 3 blocks that
    # touch 7 pages... the two pages only the freed ones touched go to a new allocation.
    with host_space(16 * MiB) as space:
        blocks = [space.malloc(3 * MiB) for _ in range(5)]
        for i, a in enumerate(blocks):
            space.write(a, pattern(i, 3 * MiB))
        for a in blocks[1::2]:
            space.free(a)
        touched = {p for a in blocks[0::2] for p in range(a // PAGE, (a + 3 * MiB - 1) // PAGE + 1)}
        free_pages = 8 - len(touched)
        big = space.malloc(free_pages * PAGE)  # fresh virtual space, every cached page remapped
        space.write(big, pattern(9, free_pages * PAGE))
        with pytest.raises(OutOfMemoryError):
            space.malloc(PAGE)
        for i, a in zip(range(0, 5, 2), blocks[0::2]):
            assert space.read(a, 3 * MiB) == pattern(i, 3 * MiB)
        assert space.read(big, free_pages * PAGE) == pattern(9, free_pages * PAGE)
        for a in blocks[0::2] + [big]:
            space.free(a)


def test_a_cached_extent_is_reused_by_a_block_that_covers_most_of_it():
    with host_space(512 * MiB, extent_size="64MiB") as space:
        a = space.malloc(64 * MiB)  # one 64 MiB extent
        space.free(a)
        before = space.stats().driver_calls()
        b = space.malloc(40 * MiB)  # 20 of its 32 pages: reused in place, no driver call
        assert b == a and space.stats().driver_calls() == before
        space.free(b)
        c = space.malloc(10 * MiB)  # 5 of 32 pages: would keep 44 MiB mapped for nothing
        assert not (a <= c < a + 64 * MiB)
        space.free(c)


def test_a_small_block_never_lands_on_an_extent_it_barely_covers():
    with host_space(256 * MiB, extent_size="32MiB") as space:
        big = space.malloc(64 * MiB)  # two 32 MiB extents
        space.free(big)
        smalls = [space.malloc(4096) for _ in range(8)]
        handles: dict[int, int] = {}
        for r in space.pages():
            if r.page_id is not None:
                handles[r.page_id] = handles.get(r.page_id, 0) + 1
        for r in space.pages():  # every page a small block is on is a one-page handle
            if any(s in r.allocations for s in smalls):
                assert handles[r.page_id] == 1
        for s in smalls:
            space.free(s)


@pytest.mark.parametrize("mode", ["copy", "mapped"])
def test_offload_moves_only_the_pages_no_pinned_neighbour_shares(mode):
    with host_space(32 * MiB, host_capacity=32 * MiB, evict_mode=mode) as space:
        a = space.malloc(3 * MiB)  # pages 0 and 1
        b = space.malloc(3 * MiB)  # pages 1 and 2: page 1 is shared
        assert a % PAGE == 0 and b == a + 3 * MiB
        space.write(a, pattern(1, 3 * MiB))
        space.write(b, pattern(2, 3 * MiB))
        assert space.offload(a) == 2 * MiB  # page 0 only: b is not evictable
        space.synchronize()
        assert space.residency(a) == "evicted" and space.residency(b) == "resident"
        assert space.read(b, 3 * MiB) == pattern(2, 3 * MiB)
        space.set_evictable(b)
        assert space.offload(a) == 3 * MiB  # now page 1 moves too, with b's bytes on it
        space.synchronize()
        assert space.residency(b) == "evicted"
        assert space.read(b, 3 * MiB) == pattern(2, 3 * MiB)  # reads reach evicted bytes
        space.ensure_resident(a)  # the shared page comes back whole: b is resident again too
        assert space.residency(a) == "resident" and space.residency(b) == "resident"
        assert space.read(a, 3 * MiB) == pattern(1, 3 * MiB)
        assert space.read(b, 3 * MiB) == pattern(2, 3 * MiB)
        space.free(a)
        space.free(b)


def test_offload_refuses_when_every_page_is_shared_with_a_pinned_allocation():
    with host_space(16 * MiB, host_capacity=16 * MiB) as space:
        a = space.malloc(4096)
        b = space.malloc(4096)  # same page
        with pytest.raises(InvalidArgumentError, match="shared"):
            space.offload(a)
        assert space.residency(a) == "resident"
        space.free(a)
        space.free(b)


@pytest.mark.parametrize("mode", ["copy", "mapped"])
def test_free_while_a_shared_page_is_away(mode):
    with host_space(32 * MiB, host_capacity=32 * MiB, evict_mode=mode) as space:
        a = space.malloc(3 * MiB)
        b = space.malloc(3 * MiB)
        space.write(b, pattern(2, 3 * MiB))
        space.set_evictable(a)
        space.set_evictable(b)
        space.offload(b)  # pages 1 and 2, a's tail on page 1 with them
        space.synchronize()
        space.free(a)  # page 0 is cached; page 1 stays away under b
        space.synchronize()
        c = space.malloc(MiB)  # must not land on the away page 1
        assert not (a + 2 * MiB <= c < a + 4 * MiB)
        space.ensure_resident(b)
        assert space.read(b, 3 * MiB) == pattern(2, 3 * MiB)
        space.free(b)
        space.free(c)
        assert space.stats().pages_evicted == 0


def test_pressure_evicts_a_shared_page_only_when_every_allocation_on_it_may_move():
    with host_space(8 * MiB, host_capacity=32 * MiB, evict_mode="copy") as space:
        a = space.malloc(3 * MiB)  # pages 0-1
        b = space.malloc(3 * MiB)  # pages 1-2
        space.write(a, pattern(1, 3 * MiB))
        space.write(b, pattern(2, 3 * MiB))
        space.set_evictable(a)  # page 0 may go; page 1 (shared with b) may not
        c = space.malloc(2 * PAGE)  # needs 2 pages: 1 is free, page 0 is evicted
        assert space.residency(a) == "evicted" and space.residency(b) == "resident"
        with pytest.raises(OutOfMemoryError):
            space.malloc(PAGE)  # page 1 is shared with b, which is not evictable
        space.free(c)
        space.ensure_resident(a)
        assert space.read(a, 3 * MiB) == pattern(1, 3 * MiB)
        assert space.read(b, 3 * MiB) == pattern(2, 3 * MiB)
        space.free(a)
        space.free(b)


def test_a_small_block_alone_on_an_extent_no_longer_holds_all_of_it():
    # What was the known limit of invariant 1: the driver maps a handle whole, so a block left
    # alone on an extent held all of it, and 64 MiB did not fit a 66 MiB space beside 512 B. At
    # the edge of that OOM the extent is now split (tests/test_extent_splits.py): the small block
    # gets a page of its own at the same address, with its bytes, and the extent is released.
    with host_space(66 * MiB, extent_size="64MiB") as space:
        space.free(space.malloc(64 * MiB))  # one cached 64 MiB extent
        half = space.malloc(32 * MiB)  # covers half of it: reused in place
        small = space.malloc(512)  # the rest of a used extent is free to take
        space.write(small, pattern(3, 512))
        space.free(half)
        records = space.pages()
        ids = [r.page_id for r in records if small in r.allocations]
        assert ids and sum(r.page_id == ids[0] for r in records) == 32, "the small block is on the extent"
        big = space.malloc(64 * MiB)
        s = space.stats()
        assert (s.num_extent_splits, s.num_extent_splits_staged, s.extent_split_pages) == (1, 0, 1)
        assert s.mapped_bytes == 66 * MiB and s.num_ooms == 0
        assert space.read(small, 512) == pattern(3, 512)
        space.write(big, pattern(9, 64 * MiB))
        assert space.read(big, 64 * MiB) == pattern(9, 64 * MiB)
        space.free(big)
        space.free(small)
