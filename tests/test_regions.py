"""Regions on the host backend: allocations made under a tag, paused and resumed together at the
same addresses (docs/regions.md).

A paused region's pages leave the device (their bytes in the host pool, or nowhere with
discard=True), so another allocation can use them; resume brings every byte back at the same
address, all or nothing. Touching a paused allocation is refused (PausedError), and a kernel
that touches one faults, as after an eviction.
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers.kernels import kernel_pattern
from helpers.sizes import PAGE, MiB
from helpers.spaces import host_space, pattern

from vtalloc.allocator import (
    AddressSpace,
    ClosedError,
    DriverError,
    HostPoolExhaustedError,
    InvalidArgumentError,
    OutOfMemoryError,
    PausedError,
)

# Sizes whose blocks share pages with each other (and one of several pages): a region of them.
WEIGHT_SIZES = [20 * MiB, 3 * MiB + 512, 700_000, 12 * MiB, 5 * MiB + 4096]


def fill_region(space: AddressSpace, tag: str, sizes: list[int]) -> dict[int, bytes]:
    """Allocate ``sizes`` under ``tag`` and write each a pattern of its own: address -> bytes."""
    out = {}
    with space.region(tag):
        for i, n in enumerate(sizes):
            a = space.malloc(n)
            out[a] = pattern(1000 + i, n)
            space.write(a, out[a])
    return out


def paused_beside(space: AddressSpace, tag: str, sizes: list[int], other: int) -> tuple[dict[int, bytes], int]:
    """A region of ``sizes`` filled and paused, then an allocation of ``other`` bytes outside it
    (written) in the pages it left: (the region's contents, the other's address)."""
    contents = fill_region(space, tag, sizes)
    space.pause(tag)
    a = space.malloc(other)
    space.write(a, pattern(9, other))
    return contents, a


def assert_bytes(space: AddressSpace, contents: dict[int, bytes]) -> None:
    for a, data in contents.items():
        assert space.read(a, len(data)) == data, f"the allocation at {a:#x} lost bytes"


def test_a_paused_region_at_capacity_lets_an_allocation_outside_it_use_the_pages_then_resumes_every_byte():
    """The issue's first CPU check: 48 MiB under "weights" fill a 48 MiB space; paused, a 48 MiB
    allocation outside the tag succeeds (it fails while the region is resident) and is freed;
    resume brings every byte back at the same addresses."""
    with host_space(48 * MiB, host_capacity=128 * MiB) as space:
        with space.region("weights"):
            a = space.malloc(48 * MiB)
        data = pattern(7, 48 * MiB)
        space.write(a, data)
        with pytest.raises(OutOfMemoryError):
            space.malloc(48 * MiB)  # at capacity
        before = space.allocations()
        assert space.pause("weights") == 48 * MiB
        r = space.region_stats("weights")
        assert (r.paused_bytes, r.paused_page_bytes, r.host_bytes, r.discarded_bytes) == (48 * MiB,) * 3 + (0,)
        assert space.stats().pages_total == 0  # released to the driver: free for anyone
        assert space.residency(a) == "paused"
        b = space.malloc(48 * MiB)
        space.write(b, pattern(8, 48 * MiB))
        assert space.read(b, 48 * MiB) == pattern(8, 48 * MiB)
        space.free(b)
        assert space.resume("weights") == 48 * MiB
        assert space.allocations() == before
        assert space.read(a, 48 * MiB) == data
        assert space.residency(a) == "resident"
        r = space.region_stats("weights")
        assert (r.paused_bytes, r.host_bytes, r.pauses, r.resumes) == (0, 0, 1, 1)
        assert space.stats().host_pool_used_bytes == 0
        space.free(a)


@pytest.mark.parametrize("evict_mode", ["copy", "mapped"])
def test_a_region_of_many_allocations_sharing_pages_comes_back_exact(evict_mode):
    with host_space(64 * MiB, host_capacity=256 * MiB, evict_mode=evict_mode) as space:
        contents = fill_region(space, "weights", WEIGHT_SIZES)
        outside = space.malloc(3 * MiB)
        space.write(outside, pattern(5, 3 * MiB))
        held = space.stats().pages_total
        touched = {p for a in contents for p in range(a // PAGE, (a + len(contents[a]) - 1) // PAGE + 1)}
        assert space.pause("weights") == len(touched) * PAGE  # every page the region touches: none is shared
        assert space.stats().pages_total == held - len(touched)
        assert space.read(outside, 3 * MiB) == pattern(5, 3 * MiB)  # the untagged block was not touched
        for a in contents:
            assert space.residency(a) == "paused"
        space.resume("weights")
        assert_bytes(space, contents)
        for a in list(contents) + [outside]:
            space.free(a)


def test_blocks_of_a_region_share_no_page_with_blocks_outside_it():
    with host_space(64 * MiB) as space:
        plain = space.malloc(100_000)
        with space.region("kv"):
            tagged = space.malloc(100_000)
        other = space.malloc(100_000)
        page = lambda a: a // PAGE  # noqa: E731
        assert page(tagged) not in (page(plain), page(plain + 99_999))
        assert page(tagged + 99_999) not in (page(other), page(other + 99_999))
        for a in (plain, tagged, other):
            space.free(a)


def test_discard_keeps_no_host_copy_and_resume_maps_fresh_memory_at_the_same_addresses():
    with host_space(64 * MiB, host_capacity=256 * MiB) as space:
        contents = fill_region(space, "kv", [16 * MiB, 4 * MiB + 512])
        space.pause("kv", discard=True)
        s = space.stats()
        assert s.host_pool_used_bytes == 0 and s.host_pool_bytes == 0  # no host byte was even set aside
        r = space.region_stats("kv")
        assert r.host_bytes == 0 and r.discarded_bytes == r.paused_bytes == r.bytes
        space.resume("kv")
        for a, data in contents.items():
            assert space.residency(a) == "resident"
            space.write(a, data)  # usable at once, at the same address
            assert space.read(a, len(data)) == data
            space.free(a)


def test_discard_drops_the_host_copy_of_a_region_paused_before():
    with host_space(64 * MiB, host_capacity=256 * MiB) as space:
        contents = fill_region(space, "kv", [8 * MiB])
        space.pause("kv")
        assert space.stats().host_pool_used_bytes == 8 * MiB
        space.pause("kv", discard=True)  # a second pause: level 2
        assert space.stats().host_pool_used_bytes == 0
        assert space.region_stats("kv").discarded_bytes == 8 * MiB
        space.resume("kv")
        for a in contents:
            space.free(a)


def test_a_paused_allocation_refuses_to_be_touched_and_may_be_freed():
    with host_space(64 * MiB, host_capacity=256 * MiB) as space:
        contents = fill_region(space, "weights", [6 * MiB, 6 * MiB])
        a, b = contents
        space.pause("weights")
        for call in (lambda: space.read(a, 1), lambda: space.write(a, b"x"), lambda: space.ensure_resident(a),
                     lambda: space.prefetch(a), lambda: space.offload(a), lambda: space.set_evictable(a)):
            with pytest.raises(PausedError, match="'weights', which is paused"):
                call()
        space.free(b)  # freeing a paused allocation is allowed: its host copy goes
        assert space.region_stats("weights").paused_bytes == 6 * MiB
        space.resume("weights")
        assert space.read(a, 6 * MiB) == contents[a]
        space.free(a)
        assert space.stats().host_pool_used_bytes == 0


@pytest.mark.host_faults
def test_a_kernel_that_touches_a_paused_allocation_faults():
    """As after an eviction in copy mode: the address is unmapped, so the host backend's guard
    counts the access (on a GPU it would be an illegal address)."""
    with host_space(64 * MiB, host_capacity=256 * MiB) as space:
        s = space._create_stream()
        with space.region("weights"):
            a = space.malloc(4 * MiB, s)
        space._run_kernel(a, 4 * MiB, stream=s, kind="fill", seed=3)
        space.pause("weights")
        space._run_kernel(a, 4 * MiB, stream=s, kind="check", seed=3)
        space._synchronize_stream(s)
        assert space._kernel_counters().kernels_faulted == 1
        space.resume("weights")
        space.free(a)


def test_pause_waits_for_kernels_still_writing_the_region_and_resume_orders_nothing_behind():
    """A pause's copies follow the last use of the region's pages on their streams: a FILL kernel
    still running when pause is called finishes first, and every byte it wrote comes back."""
    with host_space(64 * MiB, host_capacity=256 * MiB) as space:
        s1, s2 = space._create_stream(), space._create_stream()
        with space.region("weights"):
            a = space.malloc(10 * MiB, s1)
            b = space.malloc(3 * MiB + 512, s2)
        space._run_kernel(a, 10 * MiB, stream=s1, kind="fill", seed=11, duration_s=0.2)
        space._run_kernel(b, 3 * MiB + 512, stream=s2, kind="fill", seed=12, duration_s=0.1)
        space.pause("weights")
        space.resume("weights")
        assert space.read(a, 10 * MiB) == kernel_pattern(11, 10 * MiB)
        assert space.read(b, 3 * MiB + 512) == kernel_pattern(12, 3 * MiB + 512)
        space._run_kernel(a, 10 * MiB, stream=s1, kind="check", seed=11)
        space._synchronize_stream(s1)
        k = space._kernel_counters()
        assert (k.kernels_faulted, k.copy_faults, k.bytes_mismatched) == (0, 0, 0)
        space.free(a)
        space.free(b)


def test_resume_without_room_fails_all_or_nothing_and_succeeds_once_room_is_made():
    with host_space(32 * MiB, host_capacity=128 * MiB) as space:
        contents, squatter = paused_beside(space, "weights", [12 * MiB, 8 * MiB], 24 * MiB)  # not evictable
        ooms = space.stats().num_ooms
        with pytest.raises(OutOfMemoryError, match="resume\\('weights'\\) found no room.*stays paused"):
            space.resume("weights")
        assert space.stats().num_ooms == ooms + 1  # one, however many tries
        r = space.region_stats("weights")
        assert r.paused_bytes == 20 * MiB and r.host_bytes == 20 * MiB
        assert space.stats().pages_total <= 16  # nothing taken and kept: the capacity is the squatter's
        space.free(squatter)
        space.resume("weights")
        assert_bytes(space, contents)
        for a in contents:
            space.free(a)


def test_resume_evicts_allocations_marked_evictable_to_make_room():
    with host_space(32 * MiB, host_capacity=128 * MiB) as space:
        contents, other = paused_beside(space, "weights", [16 * MiB], 30 * MiB)
        space.set_evictable(other)
        space.resume("weights")
        assert space.residency(other) == "evicted"
        assert_bytes(space, contents)
        assert space.read(other, 30 * MiB) == pattern(9, 30 * MiB)
        for a in [*contents, other]:
            space.free(a)


def test_resume_waits_up_to_its_timeout_for_another_thread_to_free_memory():
    with host_space(32 * MiB, host_capacity=128 * MiB) as space:
        contents, squatter = paused_beside(space, "weights", [16 * MiB], 30 * MiB)
        freer = threading.Timer(0.3, space.free, [squatter])
        freer.start()
        t0 = time.monotonic()
        try:
            space.resume("weights", timeout=30)
        finally:
            freer.join()
        assert time.monotonic() - t0 >= 0.25
        assert_bytes(space, contents)
        assert space.stats().num_ooms == 0  # the tries that found no room counted none
        for a in contents:
            space.free(a)


def test_a_host_pool_too_small_refuses_the_pause_and_moves_nothing():
    with host_space(64 * MiB, host_capacity=16 * MiB) as space:
        contents = fill_region(space, "weights", [12 * MiB, 8 * MiB])
        held = space.stats().pages_total
        with pytest.raises(HostPoolExhaustedError, match="discard=True"):
            space.pause("weights")
        assert space.stats().pages_total == held
        assert space.stats().host_pool_used_bytes == 0
        assert_bytes(space, contents)  # still resident, readable
        assert space.pause("weights", discard=True) > 0  # no host memory needed
        space.resume("weights")
        for a in contents:
            space.free(a)


@pytest.mark.parametrize("skip", [0, 1])
def test_a_copy_refused_during_a_pause_changes_nothing(skip):
    """The first or the second copy run refused (an untagged block between two stretches of the
    region makes two runs): every page stays resident with its bytes, no host byte held."""
    with host_space(64 * MiB, host_capacity=256 * MiB) as space:
        contents = fill_region(space, "weights", WEIGHT_SIZES[:2])
        between = space.malloc(1 * MiB)
        contents.update(fill_region(space, "weights", WEIGHT_SIZES[2:]))
        held = space.stats().pages_total
        space._inject_fault("copy", 1, skip=skip)
        with pytest.raises(DriverError):
            space.pause("weights")
        assert space.stats().pages_total == held and space.stats().host_pool_used_bytes == 0
        assert_bytes(space, contents)
        before = space.stats().num_copy_calls
        space.pause("weights")
        assert space.stats().num_copy_calls - before == 2
        space.resume("weights")
        assert_bytes(space, contents)
        for a in [*contents, between]:
            space.free(a)


@pytest.mark.parametrize("op", ["copy", "map", "set_access", "create_page"])
def test_a_driver_call_refused_during_a_resume_leaves_the_region_paused_with_its_bytes(op):
    with host_space(64 * MiB, host_capacity=256 * MiB) as space:
        contents = fill_region(space, "weights", WEIGHT_SIZES)
        space.pause("weights")
        paused = space.region_stats("weights")
        space._inject_fault(op, 1)
        with pytest.raises((DriverError, OutOfMemoryError)):
            space.resume("weights")
        after = space.region_stats("weights")
        assert (after.paused_bytes, after.host_bytes) == (paused.paused_bytes, paused.host_bytes)
        space.resume("weights")
        assert_bytes(space, contents)
        for a in contents:
            space.free(a)


def test_pause_and_resume_move_many_allocations_with_a_few_driver_calls():
    """Not one driver call per page: 128 tensors of 1 MiB side by side (one-page handles, each
    page shared by two of them) go in one copy each way, and a 1 GiB region of four 256 MiB
    extents with 4 unmaps, 4 maps and one set-access."""
    with host_space(1 << 30, host_capacity=2 << 30) as space:
        with space.region("small"):
            small = [space.malloc(1 * MiB) for _ in range(128)]
        before = space.stats()
        space.pause("small")
        space.resume("small")
        after = space.stats()
        assert after.num_copy_calls - before.num_copy_calls == 2  # 64 pages: one copy run each way
        assert after.num_set_access_calls - before.num_set_access_calls == 1
        for a in small:
            space.free(a)
    with host_space(1 << 30, host_capacity=2 << 30) as space:
        with space.region("big"):
            a = space.malloc(1 << 30)
        before = space.stats()
        space.pause("big")
        space.resume("big")
        after = space.stats()
        calls = {k: getattr(after, k) - getattr(before, k)
                 for k in ("num_copy_calls", "num_map_calls", "num_unmap_calls", "num_set_access_calls")}
        assert calls == {"num_copy_calls": 2, "num_map_calls": 4, "num_unmap_calls": 4, "num_set_access_calls": 1}
        space.free(a)


def test_a_resume_brings_a_region_allocated_on_one_page_handles_back_on_extents():
    """Tensors after a small one start inside a page, so a 32 MiB tensor's 15 whole pages get one-page
    handles (a run under the 32 MiB extent minimum): the first pause unmaps one handle per page. The
    resume maps the region's stretch of pages on extents instead, so the next cycle moves a few."""
    with host_space(512 * MiB, host_capacity=512 * MiB) as space:
        contents = fill_region(space, "w", [8192] + [32 * MiB] * 8)
        calls = lambda a, b: {k: getattr(b, k) - getattr(a, k)  # noqa: E731
                              for k in ("num_unmap_calls", "num_map_calls", "num_copy_calls")}
        s0 = space.stats()
        space.pause("w")
        s1 = space.stats()
        space.resume("w")
        s2 = space.stats()
        space.pause("w")
        s3 = space.stats()
        assert calls(s0, s1)["num_unmap_calls"] >= 8 * 15  # as allocated: a handle per page
        assert calls(s1, s2)["num_map_calls"] <= 4  # one stretch: a 256 MiB extent and what is left
        assert calls(s2, s3)["num_unmap_calls"] == calls(s1, s2)["num_map_calls"]
        assert calls(s0, s1)["num_copy_calls"] == calls(s2, s3)["num_copy_calls"] == 1
        space.resume("w")
        assert_bytes(space, contents)
        for a in contents:
            space.free(a)


def test_the_tag_is_per_thread_and_nested_blocks_restore_the_one_before():
    with host_space(64 * MiB) as space:
        seen = {}

        def other_thread():
            seen["other"] = space.malloc(4096)

        with space.region("outer"):
            x = space.malloc(4096)
            with space.region("inner"):
                y = space.malloc(4096)
                t = threading.Thread(target=other_thread)
                t.start()
                t.join()
            z = space.malloc(4096)
        w = space.malloc(4096)
        rows = {r.tag: r.allocations for r in space.regions()}
        assert rows == {"outer": 2, "inner": 1}
        space.pause("inner")
        assert space.residency(y) == "paused"
        assert all(space.residency(a) == "resident" for a in (x, z, w, seen["other"]))
        space.resume("inner")
        for a in (x, y, z, w, seen["other"]):
            space.free(a)


@pytest.mark.parametrize("tag", ["", "has space", "x" * 65, "-lead", "ünïcode", 7, None, b"bytes"])
def test_a_bad_tag_is_refused_before_anything_changes(tag):
    with host_space() as space:
        with pytest.raises(InvalidArgumentError):
            with space.region(tag):
                pass
        with pytest.raises(InvalidArgumentError):
            space.pause(tag)
        with pytest.raises(InvalidArgumentError):
            space.resume(tag)
        assert space.regions() == []


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True, None])
def test_a_bad_timeout_is_refused(timeout):
    with host_space() as space:
        with pytest.raises(InvalidArgumentError):
            space.resume("weights", timeout=timeout)


def test_a_region_with_nothing_in_it_pauses_and_resumes_nothing():
    with host_space() as space:
        assert space.pause("nothing-here") == 0
        assert space.resume("nothing-here") == 0
        assert space.resume("nothing-here") == 0  # twice: nothing either
        with space.region("w"):
            a = space.malloc(4 * MiB)
        assert space.resume("w") == 0  # not paused
        space.pause("w")
        assert space.pause("w") == 0  # paused already
        space.resume("w")
        space.free(a)


def test_closing_a_space_with_a_paused_region_releases_everything_and_later_calls_raise_closed():
    space = host_space(64 * MiB, host_capacity=256 * MiB)
    fill_region(space, "weights", WEIGHT_SIZES)
    space.pause("weights")
    space.close()  # the zero-leak fixture checks pages, pinned bytes, mappings
    with pytest.raises(ClosedError):
        space.pause("weights")
    with pytest.raises(ClosedError):
        space.resume("weights")
    with pytest.raises(ClosedError):
        space.regions()
