"""What a restarted daemon inherits: pages that live processes of a previous daemon still hold.

Owns: the inherited holders (one per process, from the state file, state_file.py) and the
list the state file records (what this daemon's sessions hold, and what it inherited).
Invariants: no I/O and no lock of its own: the ledger calls it under its lock; a holder's
bytes count as whole pages of this daemon (a page size changed across the restart rounds up)
until the ledger forgets it (its process exited); bytes summed per process saturate at
MAX_HOLDER_BYTES, the state file's bound, so what is written back is always loadable.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from .records import Holder, Retained, Session, add_bytes

__all__ = ["Inherited"]


class Inherited:
    def __init__(self, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self._by_pid: dict[int, Holder] = {}

    def _pages(self, h: Holder) -> int:
        return -(-h.bytes // self.page_bytes)

    def add(self, h: Holder) -> None:
        old = self._by_pid.get(h.pid)
        self._by_pid[h.pid] = dataclasses.replace(h, bytes=add_bytes(h.bytes, old.bytes if old else 0))

    def forget(self, pid: int) -> int:
        """Process ``pid`` is gone; returns how many pages it held."""
        h = self._by_pid.pop(pid, None)
        return self._pages(h) if h else 0

    @property
    def pages(self) -> int:
        return sum(self._pages(h) for h in self._by_pid.values())

    @property
    def processes(self) -> int:
        return len(self._by_pid)

    def holders(self, sessions: Iterable[Session], retained: Iterable[Retained] = (),
                page_bytes: int = 0) -> list[Holder]:
        """One Holder per process: what its sessions hold here, what it retains (page_reclaim.py)
        and what it inherited, by pid."""
        held = {(h.pid, h.start_ticks): h for h in self._by_pid.values()}
        for r in retained:
            old = held.get((r.pid, r.start_ticks))
            held[r.pid, r.start_ticks] = Holder(r.pid, r.start_ticks, r.uid,
                                                add_bytes(len(r.pages) * page_bytes, old.bytes if old else 0))
        for s in sessions:
            if s.pages:
                old = held.get((s.pid, s.start_ticks))
                held[s.pid, s.start_ticks] = Holder(s.pid, s.start_ticks, s.uid,
                                                    add_bytes(len(s.pages) * self.page_bytes, old.bytes if old else 0))
        return sorted(held.values(), key=lambda h: (h.pid, h.start_ticks))
