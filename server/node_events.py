"""What the node tells a session's watch stream, and what an admin eviction reports.

Owns: the frozen event values the node queues for a session (an eviction request, a quota
change, a shutdown) and the outcome of an admin-asked eviction. Invariants: values only, no
I/O; service.py turns each event into its wire message.
"""

from __future__ import annotations

from dataclasses import dataclass

from .quota import Quota

__all__ = ["EvictEvent", "QuotaEvent", "ShutdownEvent", "EvictOutcome"]


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
