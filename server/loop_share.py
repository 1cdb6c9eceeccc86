"""Each caller's share of the daemon's event loop: gRPC handlers are charged the loop time they take.

Owns: :class:`LoopShare` (per caller, a bucket of event-loop seconds refilled at LOOP_SHARE seconds
per second up to LOOP_BURST_S) and :func:`timed`, which runs an awaitable and measures only the
time its own steps run (not the time it waits), so a handler is charged what it cost the loop.
limits.py's RpcLimiter uses both (Note [Loop share]).
Invariants: a charge is never negative; waiting costs nothing; one caller's debt delays only
its own later calls; not thread-safe (the event loop's).

Note [Loop share]
-----------------
Bounding calls in progress does not bound what they cost: eight threads of one uid calling
GetStats back to back (2 ms of the daemon's CPU each) made another user's leases 4 to 6 times
slower. So each handler's own loop time is measured (its steps between awaits, not its waits)
and charged to its caller, with the time gRPC took on the loop to decode its request (before
any handler runs: four senders of 4 MiB Reports, each refused at once, made another user's
leases 9.7 times slower while that was free) and encode its replies, and CALL_COST_S for gRPC's
other work on each call; a caller whose bucket is in debt waits, before its next handler runs,
until the bucket is refilled (a timer; no work), and one that would wait longer than
LOOP_WAIT_MAX_S is refused with LimitExceededError. So one caller gets at most LOOP_SHARE of
the loop's time once its burst is spent, however cheap or dear its calls are.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Hashable

__all__ = ["LoopShare", "timed", "LOOP_SHARE", "LOOP_BURST_S", "LOOP_WAIT_MAX_S", "CALL_COST_S"]

LOOP_SHARE = 0.25        # seconds of handler time per second, per caller
LOOP_BURST_S = 1.0       # what a caller may spend at once before it is paced (a lease of 4096 pages: < 0.1 s)
LOOP_WAIT_MAX_S = 2.0
# What gRPC's own machinery costs the daemon per call, beyond the handler (receiving, the
# call's task, the answer): a GetSession, whose handler does almost nothing, cost the daemon
# 0.94 ms of CPU per call at 590 calls a second on the CI machine (2026-11-28).
CALL_COST_S = 0.001


class LoopShare:
    def __init__(self, share: float = LOOP_SHARE, burst_s: float = LOOP_BURST_S, max_wait_s: float = LOOP_WAIT_MAX_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.share, self.burst_s, self.max_wait_s, self._clock = share, burst_s, max_wait_s, clock
        self._buckets: dict[Hashable, tuple[float, float]] = {}   # key -> (seconds left, at)

    def _left(self, key: Hashable, now: float) -> float:
        left, at = self._buckets.get(key, (self.burst_s, now))
        return min(self.burst_s, left + (now - at) * self.share)

    def wait(self, key: Hashable) -> float | None:
        """Seconds ``key`` waits before its next handler may run (0: at once); None past max_wait_s."""
        left = self._left(key, self._clock())
        wait = max(0.0, -left / self.share)
        return None if wait > self.max_wait_s else wait

    def charge(self, key: Hashable, seconds: float) -> None:
        now = self._clock()
        self._buckets[key] = (self._left(key, now) - max(0.0, seconds), now)
        if len(self._buckets) > 4096:   # forget callers whose buckets are full again
            for k in [k for k in self._buckets if self._left(k, now) >= self.burst_s]:
                del self._buckets[k]


async def timed(awaitable: Awaitable[Any], charge: Callable[[float], None]) -> Any:
    """Await ``awaitable``, calling ``charge(seconds)`` with the time each of its steps ran on
    the loop (what it waits for is not counted)."""
    steps = awaitable.__await__()
    value: Any = None
    error: BaseException | None = None
    while True:
        t0 = time.perf_counter()
        try:
            yielded = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            charge(time.perf_counter() - t0)
            return done.value
        except BaseException:
            charge(time.perf_counter() - t0)
            raise
        charge(time.perf_counter() - t0)
        try:
            if yielded is None:          # a bare yield (asyncio.sleep(0)): one turn of the loop
                await asyncio.sleep(0)
                value = None
            else:
                # The awaitable's own await marked the future as blocking on it; the task does
                # this reset before it waits, and so must we, to wait on it in its place.
                yielded._asyncio_future_blocking = False
                value = await yielded
            error = None
        except BaseException as e:  # noqa: BLE001 - handed to the awaitable, as the task would
            value, error = None, e
