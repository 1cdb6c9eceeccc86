"""The node's changes: waking whoever waits for pages to come back, and telling the state file.

Owns: the wake-up future that every ``wait`` shares, ``changed`` (pages came back, a session
ended, or capacity freed outside the node's sessions: an inherited holder exited) and the
hook ``on_holdings_changed`` that state_keeper.py sets to persist what client processes hold.
Invariants: no I/O of its own, on the event loop only; every ``changed`` wakes every
``wait`` and calls ``on_holdings_changed`` once; a ``wait`` re-checks its predicate at every
wake-up and returns at its timeout at the latest.
"""

from __future__ import annotations

import asyncio
from typing import Callable

__all__ = ["NodeChanges"]


class NodeChanges:
    def __init__(self) -> None:
        self._wake: asyncio.Future[None] | None = None
        # Called whenever what client processes hold changes (state_keeper.py persists it).
        self.on_holdings_changed: Callable[[], None] = lambda: None

    def changed(self) -> None:
        """Wake everyone waiting in wait(): pages came back, capacity freed, or a session ended."""
        self.on_holdings_changed()
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        self._wake = None

    async def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds, re-checking at every changed(); False at the timeout."""
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, timeout_s)
        while not predicate():
            remaining = end - loop.time()
            if remaining <= 0:
                return False
            if self._wake is None:
                self._wake = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._wake), remaining)
            except asyncio.TimeoutError:
                return predicate()
        return True
