"""What the node tells a session's watch stream, and what an admin eviction reports.

Owns: the frozen event values the node queues for a session (an eviction request, a quota
change, a shutdown), the outcome of an admin-asked eviction, and :class:`EventBox`, a
session's queue of them, bounded whatever others do (Note [Bounded event queues]).
Invariants: no I/O; service.py turns each event into its wire message.

Note [Bounded event queues]
---------------------------
A session's events wait until its client reads them on ``Watch``, and a client may never
read. Each other session's hello that declared a quota used to add a quota event to the
queue of every session of its principal, unbounded: 240 idle sessions and hellos in a loop
grew the daemon by 640 MiB in 40 s. An EventBox holds, whatever happens and however long
nobody reads: the latest quota (a newer one replaces an unread older one: only the quota in
force matters), the shutdown reason (once), the end, and the eviction requests, at most
MAX_EVICT_EVENTS of them (each asks for at least one page the session holds and has not been
asked for yet, so there are at most as many as the pages it holds; past the bound the oldest
unread request is dropped: its ticket is judged by the ledger all the same).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from .quota import Quota

__all__ = ["EvictEvent", "QuotaEvent", "ShutdownEvent", "EvictOutcome", "EventBox", "MAX_EVICT_EVENTS"]

MAX_EVICT_EVENTS = 1024


@dataclass(frozen=True)
class EvictEvent:
    request_id: int
    pages: int
    deadline_s: float


@dataclass(frozen=True)
class QuotaEvent:
    quota: Quota


@dataclass(frozen=True)
class ShutdownEvent:
    reason: str


@dataclass(frozen=True)
class EvictOutcome:
    asked: int
    returned: int
    missed: bool
    killed: bool


class EventBox:
    """One session's events until its watch reads them, bounded (Note [Bounded event queues]):
    eviction requests in order, then the latest quota, then the shutdown; ``None`` once ended."""

    def __init__(self) -> None:
        self._evicts: deque[EvictEvent] = deque(maxlen=MAX_EVICT_EVENTS)
        self._quota: QuotaEvent | None = None
        self._shutdown: ShutdownEvent | None = None
        self._ended = False
        self._ready = asyncio.Event()

    def put(self, event: object) -> None:
        """Queue ``event`` (an EvictEvent, QuotaEvent or ShutdownEvent; None ends the box)."""
        if event is None:
            self._ended = True
        elif isinstance(event, EvictEvent):
            self._evicts.append(event)
        elif isinstance(event, QuotaEvent):
            self._quota = event
        elif isinstance(event, ShutdownEvent):
            self._shutdown = self._shutdown or event
        else:
            raise TypeError(f"not a session event: {event!r}")
        self._ready.set()

    def held(self) -> int:
        """Events waiting (tests and the invariant: never more than MAX_EVICT_EVENTS + 2)."""
        return len(self._evicts) + (self._quota is not None) + (self._shutdown is not None)

    async def get(self) -> object:
        """The next event, waiting for one; None once the box is ended and empty of events."""
        while True:
            if self._evicts:
                return self._evicts.popleft()
            if self._quota is not None:
                quota, self._quota = self._quota, None
                return quota
            if self._shutdown is not None:
                shutdown, self._shutdown = self._shutdown, None
                self._ended = True
                return shutdown
            if self._ended:
                return None
            self._ready.clear()
            await self._ready.wait()
