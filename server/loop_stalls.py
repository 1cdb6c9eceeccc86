"""How long the daemon's event loop could not run, and deadlines that do not count that time.

Owns: :class:`LoopStalls` (a tick every STALL_TICK_S; a tick later than that by more than
STALL_SLACK_S counts as a stall of the whole gap) and :func:`wait_judged`, how node_pressure.py waits
for answers to eviction requests (node_pressure.py, Note [Missed eviction deadline]).
Invariant: a client is never judged late for time in which the daemon could not process its answer.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

__all__ = ["LoopStalls", "wait_judged", "STALL_TICK_S", "STALL_SLACK_S", "STALL_GRACE_S"]

STALL_TICK_S = 0.05   # LoopStalls' tick; a tick later than this plus STALL_SLACK_S is a stall
STALL_SLACK_S = 0.05
STALL_GRACE_S = 0.2   # after a stall, answers queued during it get this long to be processed


class LoopStalls:
    """Seconds the event loop could not run since start() (Note [Missed eviction deadline])."""

    def __init__(self) -> None:
        self._total = 0.0
        self._last: float | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._last = loop.time()
            self._task = loop.create_task(self._tick())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(STALL_TICK_S)
            now = loop.time()
            self._total += self._gap(now)
            self._last = now

    def _gap(self, now: float) -> float:
        gap = now - self._last - STALL_TICK_S if self._last is not None else 0.0
        return gap if gap > STALL_SLACK_S else 0.0

    def stalled(self, now: float) -> float:
        """Stalled seconds up to ``now`` (loop time), the stall still going on included."""
        return self._total + self._gap(now)


async def wait_judged(wait: Callable[[Callable[[], bool], float], Awaitable[bool]], stalls: LoopStalls,
                      predicate: Callable[[], bool], end: float, limit: float) -> bool | None:
    """``wait`` (NodeChanges.wait) until loop time ``end``, extended by the loop's own stalls meanwhile (plus
    STALL_GRACE_S each time), never past ``limit``: True when ``predicate()`` held, False
    when it did not by the extended end, None when ``limit`` left no room to extend
    (the daemon stalled: nobody can be judged late)."""
    loop = asyncio.get_running_loop()
    mark = stalls.stalled(loop.time())
    while True:
        if await wait(predicate, end - loop.time()):
            return True
        now = loop.time()
        stalled = stalls.stalled(now) - mark
        if stalled <= 0:
            return False
        mark += stalled
        end = max(end + stalled, now + STALL_GRACE_S)
        if end > limit:
            return True if await wait(predicate, limit - loop.time()) else None
