"""capacity_search: the smallest capacity at which a replay succeeds, found by search.

Owns: :func:`search_min` (the lower end, then a guess and steps that double, then bisection),
its result :class:`Search`, and :class:`BenchError`, what a replay or a search raises when it
cannot give the figure asked for. Used by bench_trace.py (host and GPU replays) and
sim_torch_allocator.py (the simulated PyTorch allocators), so both answer the same question the
same way. Invariants: pure (no vtalloc, no torch); each try is one call of ``fits``; a search
that ends with an answer has tried the unit below it and seen it fail (or it is the lower end).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

__all__ = ["BenchError", "OutOfTime", "Search", "search_min"]


class BenchError(RuntimeError):
    """A replay that cannot give the figure asked for (no capacity replays the trace, say)."""


class OutOfTime(Exception):
    """The search's deadline passed before a try."""


@dataclasses.dataclass(frozen=True)
class Search:
    units: int | None           # the smallest capacity (in units) that replayed; None: none found in time
    exact: bool                 # units - 1 was tried and failed (or units is the lower end)
    largest_failing: int | None
    tries: tuple[tuple[int, bool], ...]


def search_min(fits: Callable[[int], bool], lo: int, *, limit: int, guess: int | None = None,
               deadline: float | None = None) -> Search:
    """The smallest number of units >= ``lo`` for which ``fits`` is true, assuming it stays true
    above (a capacity that replays a trace also replays it with more). ``lo`` first; if it fails,
    ``guess`` (or lo + lo/16) and on up, the step doubling, to ``limit``; then bisection. Each
    try is one call of ``fits``. Past ``deadline`` (time.monotonic()) it stops with what it knows.
    BenchError when not even ``limit`` fits."""
    tries: list[tuple[int, bool]] = []

    def attempt(u: int) -> bool:
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime
        ok = fits(u)
        tries.append((u, ok))
        return ok

    bad: int | None = None
    good: int | None = None
    try:
        if attempt(lo):
            return Search(lo, True, None, tuple(tries))
        bad = lo
        step = max(1, lo // 16)
        hi = guess if guess is not None and lo < guess <= limit else min(lo + step, limit)
        while not attempt(hi):
            bad = hi
            if hi >= limit:
                raise BenchError(f"no capacity up to {limit} units replays the trace")
            step *= 2
            hi = min(hi + step, limit)
        good = hi
        while good - bad > 1:
            mid = (good + bad) // 2
            if attempt(mid):
                good = mid
            else:
                bad = mid
        return Search(good, True, bad, tuple(tries))
    except OutOfTime:
        return Search(good, False, bad, tuple(tries))
