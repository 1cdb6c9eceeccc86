"""The operator's limits on side-channel connections, and their per-uid accounting.

Owns: :class:`SessionLimits` (sessions per uid, pending connections per uid, the hello
timeout; validated here, built once from DaemonConfig), :class:`UidSlots` (how many of each
a uid holds now) and :class:`RefusalLog` (one warning per uid and limit, then at most one
per REFUSAL_LOG_EVERY_S with the count since). The refusal itself (a ``refused`` message
naming LimitExceededError, then the connection closes) is sent by node.py.
Invariants: a slot is taken only if it is under its limit and given back exactly once
(node.py takes and gives back in one task's try/finally); the limits apply to every uid,
root and admins included: they count per uid, so one uid's sessions never use another's.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Callable

from vtalloc.allocator.errors import InvalidArgumentError

from .protocol.errors import LimitExceededError

__all__ = ["SessionLimits", "UidSlots", "RefusalLog", "REFUSAL_LOG_EVERY_S"]

log = logging.getLogger("vtalloc.server")

REFUSAL_LOG_EVERY_S = 10.0
_HELLO_TIMEOUT_RANGE_S = (0.05, 60.0)   # shorter fails busy clients; longer lets idle ones hold a slot
_MAX_SLOTS = 1 << 20


@dataclass(frozen=True)
class SessionLimits:
    """Per uid: open sessions (client and observer both count), connections not yet past
    their hello, and how long a connection may take to say hello."""

    max_sessions_per_uid: int = 256
    max_pending_per_uid: int = 16
    hello_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_sessions_per_uid", "max_pending_per_uid"):
            v = getattr(self, name)
            if type(v) is not int or not 1 <= v <= _MAX_SLOTS:
                raise InvalidArgumentError(f"{name} must be an integer 1 .. {_MAX_SLOTS}, got {v!r}")
        low, high = _HELLO_TIMEOUT_RANGE_S
        if not isinstance(self.hello_timeout_s, (int, float)) or not low <= self.hello_timeout_s <= high:
            raise InvalidArgumentError(f"hello timeout must be {low:g} .. {high:g} s, got {self.hello_timeout_s!r}")


class UidSlots:
    """How many slots of one kind each uid holds, under one limit."""

    def __init__(self, what: str, option: str, limit: int) -> None:
        self.what = what            # e.g. "open sessions"
        self.option = option        # the `vtalloc serve` option that sets the limit
        self.limit = limit
        self._held: collections.Counter[int] = collections.Counter()

    def take(self, uid: int) -> None:
        """Take a slot for ``uid``, or raise LimitExceededError naming the limit."""
        if self._held[uid] >= self.limit:
            raise LimitExceededError(
                f"uid {uid} already has {self._held[uid]} {self.what} on this vtalloc daemon, its limit "
                f"({self.option} {self.limit}); close some, or ask the node's operator to raise it")
        self._held[uid] += 1

    def give_back(self, uid: int) -> None:
        self._held[uid] -= 1
        if self._held[uid] <= 0:
            del self._held[uid]

    def held(self, uid: int) -> int:
        return self._held[uid]


class RefusalLog:
    """Logs refusals: the first per (uid, limit), then at most one line per interval with the count."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[tuple[int, str], tuple[float, int]] = {}  # -> (logged at, refused since)

    def refused(self, uid: int, pid: int, slots: UidSlots, why: str) -> None:
        key = (uid, slots.option)
        now = self._clock()
        at, since = self._last.get(key, (None, 0))
        if at is None or now - at >= REFUSAL_LOG_EVERY_S:
            more = f" ({since} more refused since the last line)" if since else ""
            log.warning("side channel from pid %d uid %d refused: %s%s", pid, uid, why, more)
            self._last[key] = (now, 0)
        else:
            self._last[key] = (at, since + 1)
