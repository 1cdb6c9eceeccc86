"""benchmarks/sim_torch_allocator.py: the simulation of PyTorch's CUDA caching allocator, on cases
worked out by hand, on seeded random churn, and on the stored traces.

Owns: checks of the simulated policy (rounding and size classes, a 20 MiB segment shared by medium
blocks, when blocks split and how freed neighbours coalesce, the OOM path's release of cached
segments and its one retry, a fragmentation OOM of the classic policy that expandable segments
avoid, the capacity check on the allocation size rather than the pages mapped), of the binary
search's answer on a small trace, of the block lists' consistency under random churn with OOMs, of
every stored trace replaying at 4x peak live, and of the command line's JSON and table.
Invariants: CPU only, no torch, no GPU; the file runs in seconds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from helpers.benchmarks import load_script
from helpers.sizes import MiB

sim = load_script("sim_torch_allocator")
tf = sim.trace_format


def blocks_of(alloc: Any, live: list[Any]) -> list[Any]:
    """Every block the allocator knows of (free, unmapped, live), each once."""
    seen: dict[int, Any] = {}
    for pool in alloc.pools.values():
        for b in [*pool.free.values(), *pool.unmapped.values()]:
            seen[id(b)] = b
    for b in live:
        seen[id(b)] = b
    return list(seen.values())


def check_consistent(alloc: Any, live: list[Any]) -> None:
    """Each segment's blocks tile it in address order, free mapped blocks are coalesced and in their
    pool (unmapped ones in its unmapped set), and the mapped blocks add up to the reserved bytes."""
    blocks = blocks_of(alloc, live)
    mapped_total = 0
    for b in blocks:
        assert b.size > 0
        if b.next is not None:
            assert b.next.prev is b and b.ptr + b.size == b.next.ptr and b.next.segment is b.segment
            assert not (not b.allocated and b.mapped and not b.next.allocated and b.next.mapped), "not coalesced"
            assert not (not b.mapped and not b.next.mapped), "unmapped neighbours not merged"
        if b.prev is not None:
            assert b.prev.next is b
        if b.mapped:
            mapped_total += b.size
            assert b.allocated or b.pool.free.get(b.ptr) is b
        else:
            assert not b.allocated and b.pool.unmapped.get(b.ptr) is b
            assert (b.ptr - b.segment.base) % b.segment.page == 0 and b.size % b.segment.page == 0
    for pool in alloc.pools.values():
        assert pool.keys == sorted((b.size, b.ptr) for b in pool.free.values())
        assert pool.unmapped_keys == sorted(pool.unmapped)
    # every block reachable through the lists is one the allocator knows of
    ids = {id(b) for b in blocks}
    assert all(id(b.next) in ids for b in blocks if b.next is not None)
    assert mapped_total == alloc.reserved
    assert alloc.allocated == sum(b.size for b in live)


def test_rounding_and_size_classes():
    assert sim.round_size(1) == 512 and sim.round_size(512) == 512 and sim.round_size(513) == 1024
    assert sim.allocation_size(sim.round_size(1)) == 2 * MiB
    assert sim.allocation_size(1 * MiB) == 2 * MiB                            # <= 1 MiB: small pool
    assert sim.allocation_size(sim.round_size(1 * MiB + 1)) == 20 * MiB       # large pool, below 10 MiB
    assert sim.allocation_size(10 * MiB - 512) == 20 * MiB
    assert sim.allocation_size(10 * MiB) == 10 * MiB                          # from 10 MiB: 2 MiB multiples
    assert sim.allocation_size(11 * MiB) == 12 * MiB
    a = sim.ClassicAllocator()
    tiny, small, large = a.malloc(1), a.malloc(1 * MiB), a.malloc(1 * MiB + 1)
    assert (tiny.size, tiny.pool.small) == (512, True)
    assert (small.size, small.pool.small) == (1 * MiB, True)
    assert (large.size, large.pool.small) == (1 * MiB + 512, False)
    assert a.reserved == 2 * MiB + 20 * MiB  # the 1 MiB block fits in the remainder of tiny's 2 MiB segment
    assert small.ptr == tiny.ptr + 512
    b = sim.ClassicAllocator()
    b.malloc(11 * MiB)
    assert b.reserved == 12 * MiB and b.stats()["device_allocs"] == 1


def test_medium_blocks_share_one_20_MiB_segment():
    a = sim.ClassicAllocator()
    blocks = [a.malloc(5 * MiB) for _ in range(4)]
    assert a.reserved == 20 * MiB and a.device_allocs == 1
    assert [b.ptr - blocks[0].ptr for b in blocks] == [0, 5 * MiB, 10 * MiB, 15 * MiB]
    assert [b.size for b in blocks] == [5 * MiB] * 4  # the last one takes the 5 MiB remainder exactly
    blocks.append(a.malloc(5 * MiB))
    assert a.reserved == 40 * MiB and a.device_allocs == 2
    check_consistent(a, blocks)


def test_split_rules_and_coalescing():
    a = sim.ClassicAllocator()
    whole = a.malloc(19 * MiB)  # a 20 MiB segment; the 1 MiB left is not > 1 MiB: no split
    assert (whole.size, a.reserved, a.allocated) == (20 * MiB, 20 * MiB, 20 * MiB)
    e = sim.ExpandableAllocator()
    part = e.malloc(19 * MiB)  # expandable segments split any remainder >= 512 B
    assert (part.size, e.reserved, e.allocated) == (19 * MiB, 20 * MiB, 19 * MiB)
    s = a.malloc(1000)  # small pool: 1024 B at the start of a 2 MiB segment, the rest split off
    assert s.size == 1024 and s.next is not None and s.next.size == 2 * MiB - 1024
    c = sim.ClassicAllocator()
    x, y, z = (c.malloc(5 * MiB) for _ in range(3))
    c.free(x)
    c.free(z)  # merges with the 5 MiB tail: x's 5 MiB and a 10 MiB block are free
    pool = x.pool
    assert sorted(pool.keys) == [(5 * MiB, x.ptr), (10 * MiB, z.ptr)]
    check_consistent(c, [y])
    c.free(y)  # both neighbours free: one unsplit 20 MiB block
    assert pool.keys == [(20 * MiB, x.ptr)] and not pool.free[x.ptr].is_split()
    c.release_cached_blocks()
    assert c.reserved == 0 and c.device_frees == 1
    check_consistent(c, [])


def test_release_cached_segments_and_retry_once_on_oom():
    a = sim.ClassicAllocator(capacity=20 * MiB)
    a.free(a.malloc(12 * MiB))  # a cached, unsplit 12 MiB segment
    b = a.malloc(14 * MiB)      # 12 + 14 > 20: release the 12 MiB segment, retry: 14 fits
    assert (a.reserved, a.cache_flushes, a.device_frees, b.size) == (14 * MiB, 1, 1, 14 * MiB)
    held = sim.ClassicAllocator(capacity=20 * MiB)
    keep = held.malloc(12 * MiB)  # live, so nothing to release: the retry fails too
    with pytest.raises(sim.OutOfMemory):
        held.malloc(14 * MiB)
    assert held.cache_flushes == 1 and held.reserved == 12 * MiB
    check_consistent(held, [keep])


# Classic: a 100 MiB segment, reused split (60 + 30), the 60 freed; 70 more needs a new segment:
# 100 + 70 > 150 and the split segment cannot be released. Expandable: unmapping the freed 60 MiB
# (three whole 20 MiB pages) brings reserved to 40, and 40 + 70 <= 150.
FRAGMENTING = [("a", 0, 100 * MiB, 0), ("f", 0), ("a", 1, 60 * MiB, 0), ("a", 2, 30 * MiB, 0), ("f", 1),
               ("a", 3, 70 * MiB, 0)]


def test_classic_fragmentation_oom_that_expandable_segments_avoid():
    classic = sim.replay(FRAGMENTING, "classic", 150 * MiB)
    assert not classic["ok"] and classic["oom"]["event"] == 5 and classic["cache_flushes"] == 1
    assert classic["reserved_bytes"] == 100 * MiB
    e = sim.ExpandableAllocator(capacity=150 * MiB)
    live = {}
    for ev in FRAGMENTING:
        if ev[0] == "a":
            live[ev[1]] = e.malloc(ev[2], ev[3])
        else:
            e.free(live.pop(ev[1]))
        check_consistent(e, list(live.values()))
    assert (e.cache_flushes, e.peak_reserved, e.reserved) == (1, 100 * MiB, 100 * MiB)
    assert live[3].ptr - live[2].ptr == 30 * MiB  # placed after the 30 MiB block, in fresh pages
    assert sim.replay(FRAGMENTING, "classic", 170 * MiB)["ok"]


def test_binary_search_answer():
    events = [("a", 0, 12 * MiB, 0), ("f", 0), ("a", 1, 14 * MiB, 0)]
    classic = sim.min_capacity(events, "classic", 14 * MiB, first_guess=26 * MiB)
    assert (classic["bytes"], classic["largest_failing_bytes"]) == (14 * MiB, 12 * MiB)
    assert classic["scan_below"]["smaller_ok_bytes"] == []
    # Expandable: the 12 MiB request passes the check (0 + 12 <= 12), maps a whole 20 MiB page, and the
    # 14 MiB request then fits in it: 12 MiB suffices though 20 MiB is reserved (the check uses the
    # allocation size, not the pages mapped).
    exp = sim.min_capacity(events, "expandable", 14 * MiB, first_guess=20 * MiB)
    assert (exp["bytes"], exp["peak_reserved_at_min_bytes"]) == (12 * MiB, 20 * MiB)


def test_expandable_best_fit_passes_over_the_free_block_that_can_grow():
    e = sim.ExpandableAllocator()
    a = e.malloc(16 * MiB)             # page 0: a, then 4 MiB free
    start = a.ptr
    b = e.malloc(4 * MiB)              # the 4 MiB exactly
    c = e.malloc(16 * MiB)             # page 1: c, then a 4 MiB free tail
    d = e.malloc(11 * MiB)             # the tail grows by page 2: d, then a 13 MiB free tail
    assert e.reserved == 60 * MiB and d.ptr == c.ptr + 16 * MiB
    e.free(a)                          # 16 MiB free at the start, 13 MiB free at the (growable) end
    got = e.malloc(12 * MiB)           # best fit by size is the 13 MiB tail; its expandable size is
    assert got.ptr == start            # the whole virtual range, so the 16 MiB block is taken
    check_consistent(e, [got, b, c, d])


def test_streams_have_their_own_pools():
    a = sim.ClassicAllocator()
    a.free(a.malloc(5 * MiB, stream=0))
    other = a.malloc(5 * MiB, stream=1)  # stream 0's cached 20 MiB segment is not reused
    assert a.reserved == 40 * MiB and other.pool.stream == 1


@pytest.mark.parametrize("policy", sim.POLICIES)
def test_random_churn_keeps_the_block_lists_consistent(policy):
    rng = random.Random(7)
    a = sim.ALLOCATORS[policy](capacity=400 * MiB)
    live: list[Any] = []
    ooms = 0
    for step in range(1500):
        if live and (rng.random() < 0.45 or a.allocated > 300 * MiB):
            a.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 1 * MiB),
                               rng.randrange(1 * MiB, 12 * MiB), rng.randrange(10 * MiB, 60 * MiB)])
            try:
                live.append(a.malloc(size, stream=rng.randrange(2)))
            except sim.OutOfMemory:
                ooms += 1
        if step % 50 == 0:
            check_consistent(a, live)
        assert a.capacity is None or a.reserved <= a.capacity + sim.K_LARGE_BUFFER
    check_consistent(a, live)
    assert a.cache_flushes > 0 and a.device_frees > 0  # the OOM path ran and released memory
    for b in live:
        a.free(b)
    a.release_cached_blocks()
    assert a.reserved == 0
    check_consistent(a, [])


@pytest.mark.parametrize("path", tf.stored(), ids=lambda p: p.name.split(".")[0])
def test_every_stored_trace_replays_at_4x_peak_live(path: Path):
    trace = tf.load(path)
    peak = trace.peak_live_bytes()
    for policy in sim.POLICIES:
        r = sim.replay(trace.events, policy, 4 * peak)
        assert r["ok"], r["oom"]
        assert peak <= r["peak_requested_bytes"] <= r["peak_allocated_bytes"] <= r["peak_reserved_bytes"] <= 4 * peak


def test_command_line_writes_a_labelled_record(tmp_path: Path, capsys):
    out = tmp_path / "sim.json"
    assert sim.main(["--trace", "tiny_gpt2", "--out", str(out), "--note", "test"]) == 0
    text = capsys.readouterr().out
    assert "SIMULATION" in text and "| tiny_gpt2 |" in text
    record = json.loads(out.read_text())
    assert record["simulation"] is True and record["source"]["repo"] == "pytorch/pytorch"
    assert {"machine", "git", "date", "command"} <= set(record["provenance"])
    (row,) = record["traces"]
    for policy in sim.POLICIES:
        m = row["policies"][policy]["min_capacity"]
        assert m["bytes"] % sim.SEARCH_UNIT == 0 and m["largest_failing_bytes"] == m["bytes"] - sim.SEARCH_UNIT
        assert row["policies"][policy]["at_4x"]["ok"]
