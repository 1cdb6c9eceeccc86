"""``AddressSpace.memory_snapshot()`` and ``vtalloc pages --format torch`` in PyTorch's snapshot
format, read by PyTorch's own tool, ``torch.cuda._memory_viz``, on CPU (host backend).

Owns: checks that _memory_viz's offline views (``stats``, ``segments``, ``memory``, ``trace``,
the HTML plots) accept the snapshot and show vtalloc's allocations, and that the numbers add up.
Invariants: the flamegraph views are given a formatter that returns their input lines (the
default one downloads flamegraph.pl), so what they would draw is checked, offline.
"""

from __future__ import annotations

import pickle

import pytest

from vtalloc.allocator import AddressSpace
from vtalloc.allocator.memory_snapshot import space_snapshot
from vtalloc.allocator.stats import AllocationRecord, PageRecord

memory_viz = pytest.importorskip("torch.cuda._memory_viz")
MiB = 1 << 20


def _lines(flamegraph_lines: str) -> str:
    return flamegraph_lines


@pytest.fixture
def space():
    s = AddressSpace(backend="host", capacity="32MiB", page_size="2MiB")
    yield s
    s.close()


def test_a_space_snapshot_renders_in_memory_viz_and_shows_every_allocation(space):
    a = space.malloc(3 * MiB)
    b = space.malloc(100_000)
    c = space.malloc(5 * MiB)
    space.free(b)  # a hole between live allocations
    snap = pickle.loads(pickle.dumps(space.memory_snapshot()))  # as a file would carry it

    stats = memory_viz.segsum(snap)  # `python -m torch.cuda._memory_viz stats` (asserts its sums)
    live = {r.address: r for r in space.allocations()}
    assert f"segments: {len(snap['segments'])}" in stats
    reserved = sum(s["total_size"] for s in snap["segments"])
    assert reserved == sum(1 for p in space.pages() if p.address is not None) * space.page_bytes
    active = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert {b["address"]: b["requested_size"] for b in active} == {x: r.requested_bytes for x, r in live.items()}
    assert set(live) == {a, c}

    for view in (memory_viz.segments, memory_viz.memory):
        out = view(snap, format_flamegraph=_lines)
        assert "active_allocated" in out and "inactive" in out, out
        assert sum(int(line.rsplit(" ", 1)[1]) for line in out.splitlines()) == reserved
    memory_viz.trace(snap)  # no history: nothing to print, and no error
    for html in (memory_viz.segment_plot(snap), memory_viz.trace_plot(snap)):
        assert html.startswith("\n<!DOCTYPE html>") and "snapshot.pickle" in html


def test_blocks_tile_each_segment_exactly():
    page = 2 * MiB
    base = 1 << 40
    allocs = [AllocationRecord(base + 512, 1024, 1000, 0), AllocationRecord(base + page + 4096, page, page - 7, 0)]
    pages = [PageRecord(i, base + i * page, "allocated", ()) for i in range(3)] + \
            [PageRecord(None, base + 10 * page, "evicted", ()), PageRecord(7, None, "free", ())]
    snap = space_snapshot(allocs, pages, page, device=2)
    assert [(s["address"], s["total_size"]) for s in snap["segments"]] == [(base, 3 * page), (base + 10 * page, page)]
    for s in snap["segments"]:
        cursor = s["address"]
        for b in s["blocks"]:
            assert b["address"] == cursor and b["size"] > 0
            cursor += b["size"]
        assert cursor == s["address"] + s["total_size"] and s["device"] == 2
    assert snap["device_traces"] == [[], [], []]
    assert snap["vtalloc"]["pages_by_state"] == {"allocated": 3, "evicted": 1, "free": 1}
    memory_viz.segsum(snap)


def test_an_empty_space_is_an_empty_snapshot(space):
    snap = space.memory_snapshot()
    assert snap["segments"] == [] and "segments: 0" in memory_viz.segsum(snap)
