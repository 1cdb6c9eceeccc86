"""Capacity accounting across daemon restarts: the state file kept in step, inherited pages watched.

Owns: when the state file (state_file.py) is written (each time what client processes hold
changes: a lease recorded before its pages are delivered, a return, a session's end, an
inherited process's exit) and, at start, adopting what it names: every holder that is still
the very process recorded (its pidfd opened first, then its start time compared, so a pid
reused in between never counts) is counted by the ledger as inherited until it exits
(pidfd readable on the event loop; /proc polled every POLL_S where pidfd_open is missing).

Invariants: the file never names fewer pages than clients hold, except for an instant after a
failed write (logged; the next change writes again): pages are recorded before delivery and
forgotten after release. After freeze() (an orderly stop, before the daemon's own sessions
end) it is not written again, so the next daemon inherits what the clients still have mapped.
Nothing here stops the daemon: an unusable file is logged and the daemon starts with nothing
inherited.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

from .ledger import Ledger
from .records import Holder
from .state_file import StateFile, process_start_ticks

__all__ = ["StateKeeper", "POLL_S"]

log = logging.getLogger("vtalloc.server")

POLL_S = 0.5


class StateKeeper:
    def __init__(self, path: str, ledger: Ledger, capacity_changed: Callable[[], None]) -> None:
        self.file = StateFile(path)
        self.ledger = ledger
        self.capacity_changed = capacity_changed
        self._frozen = False
        self._failing = False
        self._pidfds: dict[int, int] = {}          # inherited pid -> its pidfd
        self._polled: dict[int, int] = {}          # inherited pid -> start ticks, where no pidfd
        self._poller: asyncio.Task | None = None

    def adopt(self) -> int:
        """Count what live holders in the state file hold; returns those bytes."""
        g = self.ledger.geometry
        total = 0
        for h in self.file.load(g.backend, g.device):
            try:
                pidfd = os.pidfd_open(h.pid)
            except ProcessLookupError:
                continue
            except (OSError, AttributeError):
                pidfd = None
            if process_start_ticks(h.pid) != h.start_ticks:  # gone, or the pid is another process now
                if pidfd is not None:
                    os.close(pidfd)
                continue
            self.ledger.books.inherit(h)
            self._watch(h, pidfd)
            total += h.bytes
            log.info("inherited from the previous daemon: pid %d uid %d holds %d bytes", h.pid, h.uid, h.bytes)
        self.save()
        return total

    def _watch(self, h: Holder, pidfd: int | None) -> None:
        loop = asyncio.get_running_loop()
        if h.pid in self._pidfds or h.pid in self._polled:
            if pidfd is not None:
                os.close(pidfd)
            return
        if pidfd is not None:
            self._pidfds[h.pid] = pidfd
            loop.add_reader(pidfd, self._exited, h.pid)
            return
        self._polled[h.pid] = h.start_ticks
        if self._poller is None:
            self._poller = loop.create_task(self._poll())

    async def _poll(self) -> None:
        while self._polled:
            await asyncio.sleep(POLL_S)
            for pid, ticks in list(self._polled.items()):
                if process_start_ticks(pid) != ticks:
                    self._exited(pid)
        self._poller = None

    def _exited(self, pid: int) -> None:
        pidfd = self._pidfds.pop(pid, None)
        if pidfd is not None:
            asyncio.get_running_loop().remove_reader(pidfd)
            os.close(pidfd)
        self._polled.pop(pid, None)
        pages = self.ledger.books.forget_inherited(pid)
        log.info("inherited pid %d exited: %d pages free again", pid, pages)
        self.capacity_changed()
        self.save()

    def save(self) -> None:
        """Write what client processes hold now (a no-op when unchanged or frozen)."""
        if self._frozen:
            return
        g = self.ledger.geometry
        try:
            self.file.write(g.backend, g.device, self.ledger.books.holders())
            self._failing = False
        except OSError as e:
            if not self._failing:  # once per run of failures, not once per lease
                log.error("could not write the state file %s: %s; a restart may over-commit", self.file.path, e)
            self._failing = True

    def freeze(self) -> None:
        """Write once more, then never again (an orderly stop: clients keep what they mapped)."""
        self.save()
        self._frozen = True

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for pidfd in self._pidfds.values():
            loop.remove_reader(pidfd)
            os.close(pidfd)
        self._pidfds.clear()
        self._polled.clear()
        if self._poller is not None:
            self._poller.cancel()
