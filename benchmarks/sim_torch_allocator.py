"""sim_torch_allocator: a SIMULATION (no GPU) of PyTorch's CUDA caching allocator's policy, classic
and with ``expandable_segments:True``, replaying the stored allocation traces through it.

Why this file is long: the two policies share one block/pool model and the docstring must say, with
its sources, what of PyTorch's policy is modelled and what is left out.
Owns: the simulated allocator (CachingAllocator: blocks, per-stream pools, best fit, splitting,
coalescing, the OOM path; ClassicAllocator: cudaMalloc segments; ExpandableAllocator: one growing
virtual segment per pool and stream, mapped and unmapped in pages), replay() of a trace's events,
min_capacity() (binary search for the smallest capacity with no OOM), and the CLI (Markdown table,
JSON record with provenance). Nothing here touches a GPU or imports torch or vtalloc.
Invariants: every figure printed or written is a simulation and labelled so; a replay builds a fresh
allocator, so its outcome depends on the trace and the capacity only; capacity bounds the bytes
reserved from the device (cudaMalloc segments or mapped pages) exactly as PyTorch checks
``set_per_process_memory_fraction``: a new segment / mapping is refused when reserved + the request's
allocation size would pass it; every reserved size and every allocation size is a multiple of 2 MiB,
so a search in 2 MiB steps is exact (one step less fails).

Source followed: pytorch/pytorch ``c10/cuda/CUDACachingAllocator.cpp`` at commit
001074d25084fdb87a799823e395a50f5ec044d3 (DeviceCachingAllocator; a 2.5-era revision by its features,
e.g. expandable-segment IPC), functions named below; checked against a newer copy of the same body
made generic (``CachingDeviceAllocatorImpl``, c10/core/CachingDeviceAllocator.h: the same policy) and
pytorch/pytorch ``c10/core/AllocatorConfig.h`` at 007b9bc026a6844ce406a10aa8820a466cf2d770
(the defaults: max_split_size = SIZE_MAX, max_non_split_rounding_size = kLargeBuffer,
garbage_collection_threshold = 0, roundup_power2_divisions empty, expandable_segments false).
Modelled, with those defaults:
- ``round_size``: sizes below kMinBlockSize (512 B) become 512, others round up to 512 (no power-of-2
  divisions). ``get_pool``: <= kSmallSize (1 MiB) -> small pool, else large; the pools' comparators
  order by stream first, so each stream has its own pools (one per trace stream here).
- ``get_allocation_size``: small -> kSmallBuffer (2 MiB); < kMinLargeAlloc (10 MiB) -> kLargeBuffer
  (20 MiB); else rounded up to kRoundLarge (2 MiB).
- ``get_free_block``: best fit, the smallest free block of the pool and stream with size >= the
  request, ties by lowest address (``BlockComparatorSize``). The oversize rules (max_split_size,
  max_non_split_rounding_size) are no-ops at the default max_split_size and are left out. With
  expandable segments, a free block followed by unmapped space counts as that much bigger, and the
  search walks on to the next block while its expandable size is smaller.
- ``should_split``: small pool or expandable segments: split when the remainder >= 512 B; large pool
  (classic): when the remainder > kSmallSize (1 MiB). ``alloc_found_block`` puts the request at the
  block's start. ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of
  the same segment (and same mapped state).
- ``malloc``'s order: get_free_block, else ``alloc_block``; on failure
  ``release_available_cached_blocks`` (returns false at the default max_split_size: not modelled),
  then ``release_cached_blocks`` (frees every unsplit cached segment of every pool and stream; with
  expandable segments ``release_blocks`` / ``unmap_block`` unmap every whole free page and drop a
  segment left wholly unmapped) and ``alloc_block`` once more; a second failure is the OOM.
- ``alloc_block``: with a fraction set, refuse when total_allocated_memory + alloc_size > allowed
  (alloc_size, not the bytes about to be mapped, also for expandable segments); classic: one
  cudaMalloc of alloc_size. Expandable: ``try_allocate_expandable_block`` /
  ``find_expandable_block`` / ``map_block``: the lowest-address unmapped range of the pool and stream
  (with the free block just before it) that has room, else a new ``ExpandableSegment`` whose virtual
  size is 1 1/8 of the device's memory; pages (``segment_size_``) are kSmallBuffer (2 MiB) in the
  small pool and kLargeBuffer (20 MiB) in the large pool, as the Note [Expandable Segments] and
  find_expandable_block say; ``ExpandableSegment::map`` / ``unmap`` round outward / inward to pages.
  So under a fraction, expandable segments can reserve up to a page over the cap (mapped > alloc_size).
Left out: CUDA graph private pools and mempools (use_on_oom), per-process fraction rounding
(allowed = fraction * total: we take the capacity in bytes), record_stream / cross-stream events
(a free is immediate), garbage collection (off by default), roundup_power2_divisions,
max_split_size_mb (and so release_available_cached_blocks), the free-memory callbacks, IPC, and what
the driver does: cudaMalloc addresses are modelled as a bump allocator (they only break best-fit ties),
and cudaMalloc / cuMemCreate never fail on their own (the GPU is taken to be bigger than the cap, as
with a fraction set on an 80 GB H100: only the fraction's check refuses).

    python benchmarks/sim_torch_allocator.py                                   # every stored trace
    python benchmarks/sim_torch_allocator.py --trace resnet50 --trace /tmp/t.json.gz --out /tmp/sim.json
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Any, Iterable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # trace_format and provenance sit beside this file

from lib import trace_format  # noqa: E402
from lib.capacity_search import BenchError, search_min  # noqa: E402
from lib.provenance import git_info, machine_info  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
K_MIN_BLOCK_SIZE = 512          # kMinBlockSize
K_SMALL_SIZE = 1 * MiB          # kSmallSize
K_SMALL_BUFFER = 2 * MiB        # kSmallBuffer: small-pool segments, small-pool expandable pages
K_LARGE_BUFFER = 20 * MiB       # kLargeBuffer: 1-10 MiB segments, large-pool expandable pages
K_MIN_LARGE_ALLOC = 10 * MiB    # kMinLargeAlloc
K_ROUND_LARGE = 2 * MiB         # kRoundLarge
DEVICE_TOTAL = 80 * GiB         # an H100's memory: only sizes an expandable segment's virtual range
SEARCH_UNIT = 2 * MiB           # every reserved size and allocation size is a multiple of this
MEASURE_MULTIPLE = 4            # peak reserved is reported at 4x peak live
POLICIES = ("classic", "expandable")
DEFAULT_OUT = "benchmarks/results/sim_torch_allocator-{date}.json"
SOURCE = {"repo": "pytorch/pytorch", "path": "c10/cuda/CUDACachingAllocator.cpp",
          "commit": "001074d25084fdb87a799823e395a50f5ec044d3",
          "defaults_from": "pytorch/pytorch c10/core/AllocatorConfig.h @ 007b9bc026a6844ce406a10aa8820a466cf2d770"}


def round_size(size: int) -> int:
    """DeviceCachingAllocator::round_size with no roundup_power2_divisions."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """get_allocation_size: the segment a cudaMalloc would get for a (rounded) request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class OutOfMemory(Exception):
    """The simulated allocator's OutOfMemoryError: alloc_block failed after release_cached_blocks."""


@dataclasses.dataclass(eq=False, slots=True)
class Segment:
    """One expandable segment's virtual range (ExpandableSegment): ``pages`` pages of ``page`` bytes."""
    base: int
    page: int
    pages: int


@dataclasses.dataclass(eq=False, slots=True)
class Block:
    ptr: int
    size: int
    pool: Pool = dataclasses.field(repr=False)
    segment: Segment | None = dataclasses.field(default=None, repr=False)  # None: a cudaMalloc segment
    allocated: bool = False
    mapped: bool = True
    prev: Block | None = dataclasses.field(default=None, repr=False)
    next: Block | None = dataclasses.field(default=None, repr=False)
    requested: int = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class Pool:
    """One BlockPool for one stream: free mapped blocks ordered by (size, address), unmapped blocks by address."""

    def __init__(self, small: bool, stream: int) -> None:
        self.small, self.stream = small, stream
        self.keys: list[tuple[int, int]] = []
        self.free: dict[int, Block] = {}
        self.unmapped_keys: list[int] = []
        self.unmapped: dict[int, Block] = {}

    def insert(self, b: Block) -> None:
        bisect.insort(self.keys, (b.size, b.ptr))
        self.free[b.ptr] = b

    def erase(self, b: Block) -> None:
        i = bisect.bisect_left(self.keys, (b.size, b.ptr))
        assert self.keys[i] == (b.size, b.ptr) and self.free.pop(b.ptr) is b
        del self.keys[i]

    def insert_unmapped(self, b: Block) -> None:
        bisect.insort(self.unmapped_keys, b.ptr)
        self.unmapped[b.ptr] = b

    def erase_unmapped(self, b: Block) -> None:
        i = bisect.bisect_left(self.unmapped_keys, b.ptr)
        assert self.unmapped_keys[i] == b.ptr and self.unmapped.pop(b.ptr) is b
        del self.unmapped_keys[i]


class CachingAllocator:
    """What the classic and expandable policies share: DeviceCachingAllocator's malloc / free.
    ``capacity`` (bytes, None for none) plays set_per_process_memory_fraction's allowed_memory_maximum."""

    policy = "base"

    def __init__(self, capacity: int | None = None, device_total: int = DEVICE_TOTAL) -> None:
        self.capacity = capacity
        self.device_total = max(device_total, capacity or 0)
        self.pools: dict[tuple[bool, int], Pool] = {}
        self.reserved = self.peak_reserved = 0      # total_allocated_memory: segments / mapped pages
        self.allocated = self.peak_allocated = 0    # sizes of the blocks handed out
        self.requested = self.peak_requested = 0
        self.device_allocs = self.device_frees = 0  # cudaMalloc / map, cudaFree / unmap calls
        self.cache_flushes = 0                      # release_cached_blocks calls (the OOM path)
        self._next_va = 1 << 40

    def _va(self, size: int, align: int = K_SMALL_BUFFER) -> int:
        ptr = -(-self._next_va // align) * align
        self._next_va = ptr + size
        return ptr

    def pool(self, size: int, stream: int) -> Pool:
        key = (size <= K_SMALL_SIZE, stream)
        if key not in self.pools:
            self.pools[key] = Pool(*key)
        return self.pools[key]

    def _reserve(self, n: int) -> None:
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.device_allocs += 1

    def malloc(self, orig_size: int, stream: int = 0) -> Block:
        size = round_size(orig_size)
        pool = self.pool(size, stream)
        alloc_size = allocation_size(size)
        block = self.get_free_block(pool, size)
        if block is None:
            block = self.alloc_block(pool, size, alloc_size)
            if block is None:
                self.release_cached_blocks()
                block = self.alloc_block(pool, size, alloc_size)
            if block is None:
                raise OutOfMemory(f"{self.policy}: {orig_size} B (alloc size {alloc_size}) with {self.reserved} B "
                                  f"reserved, {self.allocated} B allocated, capacity {self.capacity}")
        if block.size - size > 0 and self.should_split(block, size):
            front = Block(block.ptr, size, pool, block.segment, prev=block.prev, next=block)
            if block.prev is not None:
                block.prev.next = front
            block.prev = front
            block.ptr += size
            block.size -= size
            pool.insert(block)
            block = front
        block.allocated, block.requested = True, orig_size
        self.allocated += block.size
        self.requested += orig_size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        return block

    def free(self, block: Block) -> None:
        assert block.allocated
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        self._merge(block, block.prev)
        self._merge(block, block.next)
        block.pool.insert(block)

    def _merge(self, dst: Block, src: Block | None) -> None:
        """try_merge_blocks: fold the free neighbour ``src`` (same mapped state) into ``dst``."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        (src.pool.erase if src.mapped else src.pool.erase_unmapped)(src)
        if dst.prev is src:
            dst.ptr, dst.prev = src.ptr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def alloc_block(self, pool: Pool, size: int, alloc_size: int) -> Block | None:
        if self.capacity is not None and self.reserved + alloc_size > self.capacity:
            return None  # set_fraction && total_allocated_memory + size > allowed_memory_maximum
        return self._grow(pool, size, alloc_size)

    def release_cached_blocks(self) -> None:
        self.cache_flushes += 1
        for key in sorted(self.pools, key=lambda k: (k[0], k[1])):  # large_blocks, then small_blocks
            self.release_blocks(self.pools[key])

    def get_free_block(self, pool: Pool, size: int) -> Block | None:
        raise NotImplementedError

    def should_split(self, block: Block, size: int) -> bool:
        raise NotImplementedError

    def _grow(self, pool: Pool, size: int, alloc_size: int) -> Block | None:
        raise NotImplementedError

    def release_blocks(self, pool: Pool) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, int]:
        return {"reserved_bytes": self.reserved, "peak_reserved_bytes": self.peak_reserved,
                "peak_allocated_bytes": self.peak_allocated, "peak_requested_bytes": self.peak_requested,
                "device_allocs": self.device_allocs, "device_frees": self.device_frees,
                "cache_flushes": self.cache_flushes}


class ClassicAllocator(CachingAllocator):
    """The default policy: one cudaMalloc segment of get_allocation_size per miss."""

    policy = "classic"

    def get_free_block(self, pool: Pool, size: int) -> Block | None:
        i = bisect.bisect_left(pool.keys, (size, -1))
        if i == len(pool.keys):
            return None
        block = pool.free[pool.keys[i][1]]
        pool.erase(block)
        return block

    def should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        return remaining >= K_MIN_BLOCK_SIZE if block.pool.small else remaining > K_SMALL_SIZE

    def _grow(self, pool: Pool, size: int, alloc_size: int) -> Block | None:
        self._reserve(alloc_size)
        return Block(self._va(alloc_size), alloc_size, pool)

    def release_blocks(self, pool: Pool) -> None:
        for _, ptr in list(pool.keys):
            block = pool.free[ptr]
            if not block.is_split():
                pool.erase(block)
                self.reserved -= block.size
                self.device_frees += 1


class ExpandableAllocator(CachingAllocator):
    """expandable_segments:True: per pool and stream, virtual segments that grow by mapping pages."""

    policy = "expandable"

    def get_free_block(self, pool: Pool, size: int) -> Block | None:
        i = bisect.bisect_left(pool.keys, (size, -1))
        if i == len(pool.keys):
            return None

        def expandable_size(b: Block) -> int:
            return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

        block = pool.free[pool.keys[i][1]]
        for j in range(i + 1, len(pool.keys)):
            nxt = pool.free[pool.keys[j][1]]
            if expandable_size(nxt) >= expandable_size(block):
                break
            block = nxt
        pool.erase(block)
        return block

    def should_split(self, block: Block, size: int) -> bool:
        return block.size - size >= K_MIN_BLOCK_SIZE

    def _find_expandable_block(self, pool: Pool, size: int) -> Block:
        def has_room(b: Block | None) -> bool:
            n = 0
            while n < size and b is not None and not b.allocated:
                n, b = n + b.size, b.next
            return n >= size

        for ptr in pool.unmapped_keys:
            c = pool.unmapped[ptr]
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            if has_room(c):
                return c
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        seg = Segment(0, page, -(-(self.device_total + self.device_total // 8) // page))
        seg.base = self._va(seg.pages * page, K_LARGE_BUFFER)
        candidate = Block(seg.base, seg.pages * page, pool, seg, mapped=False)
        pool.insert_unmapped(candidate)
        return candidate

    def _map_block(self, b: Block, size: int) -> None:
        seg = b.segment
        assert seg is not None and not b.mapped and 0 < size <= b.size and (b.ptr - seg.base) % seg.page == 0
        mapped = -(-size // seg.page) * seg.page
        pool = b.pool
        pool.erase_unmapped(b)
        b.mapped = True
        if mapped < b.size:
            rest = Block(b.ptr + mapped, b.size - mapped, pool, seg, mapped=False, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            pool.insert_unmapped(rest)
            b.size = mapped
        self._merge(b, b.prev)
        self._merge(b, b.next)
        pool.insert(b)
        self._reserve(mapped)

    def _grow(self, pool: Pool, size: int, alloc_size: int) -> Block | None:
        c = self._find_expandable_block(pool, size)
        if not c.mapped:
            self._map_block(c, min(c.size, size))
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            self._map_block(nxt, min(size - c.size, nxt.size))
            c = nxt
        pool.erase(c)
        return c

    def _unmap_block(self, b: Block) -> None:
        seg = b.segment
        assert seg is not None
        lo, hi = b.ptr - seg.base, b.ptr - seg.base + b.size
        begin, end = -(-lo // seg.page), hi // seg.page
        if begin >= end:
            return
        pool = b.pool
        pool.erase(b)
        uptr, usize = seg.base + begin * seg.page, (end - begin) * seg.page
        if uptr > b.ptr:
            before = Block(b.ptr, uptr - b.ptr, pool, seg, prev=b.prev, next=b)
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            pool.insert(before)
        after_size = b.ptr + b.size - (uptr + usize)
        if after_size > 0:
            after = Block(uptr + usize, after_size, pool, seg, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        b.ptr, b.size, b.mapped = uptr, usize, False
        self._merge(b, b.prev)
        self._merge(b, b.next)
        pool.insert_unmapped(b)
        self.reserved -= usize
        self.device_frees += 1

    def release_blocks(self, pool: Pool) -> None:
        for block in [pool.free[ptr] for _, ptr in pool.keys]:
            self._unmap_block(block)
            if not block.mapped and not block.is_split():
                pool.erase_unmapped(block)  # release_expandable_segment: the whole segment is unmapped


ALLOCATORS: dict[str, type[CachingAllocator]] = {"classic": ClassicAllocator, "expandable": ExpandableAllocator}


def replay(events: Iterable[tuple], policy: str, capacity: int | None) -> dict[str, Any]:
    """The trace's events through a fresh simulated allocator; stops at the first OOM."""
    alloc = ALLOCATORS[policy](capacity)
    live: dict[int, Block] = {}
    done, oom = 0, None
    for k, e in enumerate(events):
        if e[0] == "a":
            try:
                live[e[1]] = alloc.malloc(e[2], e[3])
            except OutOfMemory as exc:
                oom = {"event": k, "size": e[2], "error": str(exc)}
                break
        else:
            alloc.free(live.pop(e[1]))
        done += 1
    return {"ok": oom is None, "capacity_bytes": capacity, "events_done": done, "oom": oom, **alloc.stats()}


def min_capacity(events: tuple[tuple, ...], policy: str, peak_live: int, first_guess: int) -> dict[str, Any]:
    """The smallest capacity (a multiple of SEARCH_UNIT) that replays with no OOM, by the search
    bench_trace.py uses for vtalloc (capacity_search.search_min): one unit first, then
    ``first_guess`` (the uncapped peak reserved) and up, then bisection. The answer succeeds and
    one unit less fails (a caching allocator need not be monotone in its capacity: every smaller
    capacity from a large page under peak live is then replayed too, and those that succeed are
    listed in ``scan_below``)."""
    tries: list[dict[str, Any]] = []

    def fits(units: int) -> bool:
        r = replay(events, policy, units * SEARCH_UNIT)
        tries.append({"capacity_bytes": units * SEARCH_UNIT, "ok": r["ok"],
                      "peak_reserved_bytes": r["peak_reserved_bytes"]})
        return bool(r["ok"])

    try:
        found = search_min(fits, 1, limit=64 * max(peak_live, GiB) // SEARCH_UNIT,
                           guess=max(1, -(-first_guess // SEARCH_UNIT)))
    except BenchError as e:
        raise BenchError(f"{policy}: {e}") from None
    hi, lo = found.units, found.largest_failing or 0
    at = next(t for t in reversed(tries) if t["capacity_bytes"] == hi * SEARCH_UNIT)
    # The check of monotonicity: every unit from a page under peak live up to the answer, replayed.
    start = max(1, (peak_live - K_LARGE_BUFFER) // SEARCH_UNIT)
    also_ok = [u * SEARCH_UNIT for u in range(start, lo) if replay(events, policy, u * SEARCH_UNIT)["ok"]]
    return {"bytes": hi * SEARCH_UNIT, "largest_failing_bytes": lo * SEARCH_UNIT,
            "overhead_pct": (hi * SEARCH_UNIT - peak_live) / peak_live * 100,
            "peak_reserved_at_min_bytes": at["peak_reserved_bytes"], "tries": tries,
            "scan_below": {"from_bytes": start * SEARCH_UNIT, "replays": max(0, lo - start),
                           "smaller_ok_bytes": also_ok}}


def measure(trace: trace_format.Trace, path: Path) -> dict[str, Any]:
    peak_live = trace.peak_live_bytes()
    row: dict[str, Any] = {"name": trace.name, "path": str(path), "events": len(trace.events),
                           "allocations": trace.num_allocs, "streams": trace.streams, "peak_live_bytes": peak_live,
                           "policies": {}}
    for policy in POLICIES:
        uncapped = replay(trace.events, policy, None)
        at_4x = replay(trace.events, policy, MEASURE_MULTIPLE * peak_live)
        row["policies"][policy] = {"uncapped": uncapped, "at_4x": at_4x,
                                   "min_capacity": min_capacity(trace.events, policy, peak_live,
                                                                uncapped["peak_reserved_bytes"])}
    return row


def _mib(n: float) -> str:
    return f"{n / MiB:,.1f} MiB"


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| trace | peak live | classic: min capacity (% over live) | classic: peak reserved at 4x / live "
           "| expandable: min capacity (% over live) | expandable: peak reserved at 4x / live |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [r["name"], _mib(r["peak_live_bytes"])]
        for policy in POLICIES:
            p = r["policies"][policy]
            m, a = p["min_capacity"], p["at_4x"]
            smaller = m["scan_below"]["smaller_ok_bytes"]  # a non-monotone outcome: said, not hidden
            cells.append(f"{_mib(m['bytes'])} ({m['overhead_pct']:+.1f}%)"
                         + (f" [also no OOM at {', '.join(_mib(b) for b in smaller)}]" if smaller else ""))
            peak = a["peak_reserved_bytes"]
            cells.append(f"{_mib(peak)} ({peak / r['peak_live_bytes']:.3f}x)" + ("" if a["ok"] else " OOM"))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def resolve_trace(spec: str) -> list[Path]:
    """The traces a --trace names: a file, a folder of them, or a name in benchmarks/traces/."""
    try:
        return trace_format.resolve(spec)
    except trace_format.TraceNotFound as e:
        raise SystemExit(f"sim_torch_allocator: {e}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trace", action="append", default=[], metavar="NAME_OR_PATH",
                    help="a trace file, a folder of them (every *.json.gz), or a name in benchmarks/traces/ "
                         "(repeatable; default: every stored trace)")
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON path ({{date}} filled in; default {DEFAULT_OUT})")
    ap.add_argument("--note", action="append", default=[], help="a note stored in the JSON (repeatable)")
    a = ap.parse_args(argv)
    paths = [p for t in a.trace for p in resolve_trace(t)] if a.trace else trace_format.stored()
    traces = [(trace_format.load(p), p) for p in paths]  # every file validates before any replay
    date = _dt.date.today().isoformat()

    rows: list[dict[str, Any]] = []
    record = {"benchmark": "sim_torch_allocator", "simulation": True,
              "what": "a Python simulation of PyTorch's CUDA caching allocator policy (classic and "
                      "expandable_segments:True) replaying allocation traces; no GPU, no torch: not a measurement",
              "source": SOURCE,
              "settings": {"search_unit_bytes": SEARCH_UNIT, "measure_multiple": MEASURE_MULTIPLE,
                           "device_total_bytes": DEVICE_TOTAL, "policies": list(POLICIES),
                           "capacity": "set_per_process_memory_fraction's check: reserved + alloc size <= capacity"},
              "provenance": {"machine": machine_info(), "git": git_info(), "date": date,
                             "command": " ".join(["benchmarks/sim_torch_allocator.py",
                                                  *(sys.argv[1:] if argv is None else argv)])},
              "traces": rows, "notes": a.note}
    out = Path(a.out.format(date=date))
    out.parent.mkdir(parents=True, exist_ok=True)
    for trace, path in traces:
        rows.append(measure(trace, path))
        out.write_text(json.dumps(record, indent=1) + "\n")  # after each trace: an interrupted run keeps it
        print(f"  {trace.name}: done", flush=True)
    print("SIMULATION of PyTorch's CUDA caching allocator (not measured on a GPU)\n")
    print(table(rows))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
