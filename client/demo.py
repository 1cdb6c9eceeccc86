"""The `vtalloc demo` job: show what a paged address space does that a plain allocator cannot.

Fills an address space with one-page allocations, frees every other one (the checkerboard
that strands memory in a contiguous allocator), then asks for one allocation as large as all
the holes together. vtalloc serves it by remapping the freed pages under a new virtual
range, and the survivors' bytes are checked intact. Runs on the host backend without a GPU,
and on the cuda backend when one is usable.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from vtalloc.allocator import AddressSpace, format_size

__all__ = ["DefragReport", "run_defrag_demo"]


@dataclass(frozen=True)
class DefragReport:
    backend: str
    capacity_bytes: int
    page_bytes: int
    blocks: int
    freed_blocks: int
    big_allocation_bytes: int
    survivors_intact: bool
    pages_reclaimed: int
    stats_before: dict
    stats_after: dict


def _pattern(i: int, n: int) -> bytes:
    seed = hashlib.sha256(i.to_bytes(8, "little")).digest()
    return (seed * (n // len(seed) + 1))[:n]


def run_defrag_demo(backend: str = "auto", capacity: int | str = "64MiB", device: int = 0) -> DefragReport:
    with AddressSpace(backend=backend, device=device, capacity=capacity) as space:
        page = space.page_bytes
        nblocks = space.capacity_bytes // page
        addrs = [space.malloc(page) for _ in range(nblocks)]
        probe = min(page, 4096)
        for i, a in enumerate(addrs):
            space.write(a, _pattern(i, probe))
        freed = list(range(0, nblocks, 2))
        for i in freed:
            space.free(addrs[i])
        before = space.stats().as_dict()
        big = space.malloc(len(freed) * page)  # as large as all the holes together
        space.write(big, b"\xab" * probe)
        intact = all(space.read(addrs[i], probe) == _pattern(i, probe) for i in range(1, nblocks, 2))
        after = space.stats().as_dict()
        report = DefragReport(
            backend=space.backend, capacity_bytes=space.capacity_bytes, page_bytes=page, blocks=nblocks,
            freed_blocks=len(freed), big_allocation_bytes=len(freed) * page, survivors_intact=intact,
            pages_reclaimed=after["num_page_reclaims"] - before["num_page_reclaims"],
            stats_before=before, stats_after=after,
        )
        space.free(big)
        for i in range(1, nblocks, 2):
            space.free(addrs[i])
    return report


def describe(report: DefragReport) -> list[str]:
    return [
        f"backend {report.backend}: capacity {format_size(report.capacity_bytes)} in pages of {format_size(report.page_bytes)}",
        f"filled with {report.blocks} one-page allocations, freed every other one ({report.freed_blocks} holes)",
        f"allocated {format_size(report.big_allocation_bytes)} in one piece: no free range that large existed,"
        f" {report.pages_reclaimed} freed pages were unmapped and remapped under it",
        f"surviving allocations' bytes intact: {report.survivors_intact}",
    ]
