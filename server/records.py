"""The ledger's records: the node's geometry, sessions, eviction tickets and counters.

Owns: the mutable records the ledger (ledger.py) keeps and alone changes, and the node's
counters, one per field of pages.proto's ``Counters`` message (NODE_COUNTERS), so the proto
is the one list of them. Invariant: no rule lives here; a record only holds state.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Sequence
from dataclasses import dataclass, field

from .protocol.rpc import MAX_LEASE_PAGES, MAX_RETURN_PAGES, NODE_COUNTERS
from .views import ClientReport, PageUseReport

__all__ = ["SESSION_KINDS", "NodeGeometry", "NodeCounters", "SessionCounters", "Session", "EvictTicket", "Holder",
           "Retained", "MAX_HOLDER_BYTES", "add_bytes"]

SESSION_KINDS = ("client", "observer")
# The node's counters: one int field per field of pages.proto's Counters message.
if TYPE_CHECKING:
    class NodeCounters:  # what make_dataclass builds: one int field per name of NODE_COUNTERS
        __dataclass_fields__: ClassVar[dict[str, Any]]

        def __getattr__(self, name: str) -> int: ...
        def __setattr__(self, name: str, value: int) -> None: ...
else:
    NodeCounters = dataclasses.make_dataclass("NodeCounters", [(name, int, 0) for name in NODE_COUNTERS])


@dataclass(frozen=True)
class NodeGeometry:
    backend: str
    device: int
    page_bytes: int
    capacity_pages: int
    host_capacity_bytes: int
    evict_deadline_s: float
    max_lease_pages: int = MAX_LEASE_PAGES
    max_return_pages: int = MAX_RETURN_PAGES
    reclaim: str = "revoke"   # page_reclaim.py: "revoke" (host) or "retain" (pages counted until their process exits)

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_pages * self.page_bytes


@dataclass
class SessionCounters:
    evict_requests: int = 0
    evict_pages_asked: int = 0
    evict_pages_returned: int = 0
    deadline_misses: int = 0
    quota_rejections: int = 0
    leases: int = 0
    pages_leased: int = 0
    pages_returned: int = 0


@dataclass
class Session:
    """A live side-channel connection and what it holds. Mutated only by the Ledger."""

    session_id: str
    token: str
    pid: int
    uid: int
    gid: int
    principal: str
    kind: str
    started: float
    pages: dict[int, str] = field(default_factory=dict)  # page id -> a PAGE_STATES value
    report: ClientReport | None = None                    # its last report (page uses apart: below)
    page_uses: Sequence[PageUseReport] = ()               # that report's page uses (reports.ReportedUses:
                                                          # as received, decoded when a view reads them)
    report_at: float = 0.0
    evictions_per_s: float = 0.0
    restores_per_s: float = 0.0
    outstanding_evict: int = 0                            # pages asked and not yet returned
    counters: SessionCounters = field(default_factory=SessionCounters)
    live: bool = True
    start_ticks: int = 0                                  # its process's start time (state_file.py)
    cgroup: str = ""                                      # its cgroup v2 path when it connected ("" in uid mode)
    pod: str | None = None                                # its pod UID (--principal-by pod; principals.py)
    declared: tuple[int | None, int | None] | None = None  # the (min, max) its hello declared (client sessions)


@dataclass
class EvictTicket:
    """One eviction request sent to one session, open until its deadline."""

    request_id: int
    session_id: str
    asked: int
    returned: int = 0
    open: bool = True


@dataclass
class Retained:
    """Pages a process was leased and may still reach, though none of its sessions holds them
    (given back, or its session ended) on a backend that cannot revoke them: counted against
    its principal and the node until the process exits (page_reclaim.py)."""

    pid: int
    start_ticks: int
    uid: int
    principal: str
    pages: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Holder:
    """A process and the bytes of the node's pages it holds: a line of the state file, and what
    a restarted daemon inherits from the previous one's sessions (state_file.py)."""

    pid: int
    start_ticks: int                                      # field 22 of /proc/<pid>/stat when recorded
    uid: int
    bytes: int                                            # at most MAX_HOLDER_BYTES


MAX_HOLDER_BYTES = 2 ** 63 - 1  # every field of a state-file entry is 0 .. this (state_file.py); sums saturate


def add_bytes(a: int, b: int) -> int:
    """``a + b``, at most MAX_HOLDER_BYTES (a holder's bytes, summed from entries or sessions)."""
    return min(a + b, MAX_HOLDER_BYTES)
