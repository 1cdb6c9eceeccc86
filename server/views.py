"""The ledger's answers: frozen views whose field names are those of pages.proto's messages.

Owns: the read-only records the ledger hands out (service.py's ``to_message`` fills a proto
message from one by field name, nested and repeated), what a client reports about its pages
(:class:`ClientReport`, :class:`PageUseReport`), and the names of page states and uses
(``PAGE_STATES``, ``PAGE_USES``: the proto's PageState and PageUse values, lower case,
without their prefix). Invariant: a view is a snapshot; nothing here refers back to the
ledger's live state, so a view may be read outside its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from .quota import Quota

__all__ = [
    "PAGE_STATES", "PAGE_USES", "PageUseReport", "RegionReport", "ClientReport", "SessionInfoView", "SessionView", "PrincipalView",
    "DeviceView", "NodeView", "PageView", "SessionPagesView", "PageMapView",
]

# Page states as the daemon knows them; what a client does with a leased page it reports
# per page (PAGE_USES, by the daemon's page id) and as counts, in ClientReport.
PAGE_STATES = ("delivering", "leased")
PAGE_USES = ("unknown", "resident", "cached", "unmapped", "in_flight")


@dataclass(frozen=True)
class PageUseReport:
    page_id: int
    use: str  # a PAGE_USES value


@dataclass(frozen=True)
class RegionReport:
    """One region of a client (docs/regions.md): the allocations it made under one tag."""

    tag: str
    bytes: int = 0
    paused_bytes: int = 0  # off the device until the client resumes the region
    host_bytes: int = 0


@dataclass(frozen=True)
class ClientReport:
    """What a client says about its own pages (the daemon cannot see inside its mappings)."""

    allocated_bytes: int = 0
    active_bytes: int = 0
    mapped_bytes: int = 0
    cached_bytes: int = 0
    pages_total: int = 0
    pages_resident: int = 0          # mapped, under live allocations (the word of metrics and the CLI)
    pages_cached: int = 0
    pages_free: int = 0
    evicted_bytes: int = 0
    evicted_pages: int = 0
    evictions_total: int = 0
    restores_total: int = 0
    ooms_total: int = 0
    page_uses: tuple[PageUseReport, ...] = ()  # per leased page; pages the session does not hold are dropped
    paused_bytes: int = 0            # bytes of its allocations in paused regions
    regions: tuple[RegionReport, ...] = ()  # one per tag, at most MAX_REPORT_REGIONS


@dataclass(frozen=True)
class SessionInfoView:
    session_id: str
    pid: int
    uid: int
    principal: str
    kind: str
    backend: str
    device: int
    page_bytes: int
    capacity_bytes: int
    host_capacity_bytes: int
    quota: Quota
    leased_pages: int
    evict_deadline_s: float
    admin: bool


@dataclass(frozen=True)
class SessionView:
    info: SessionInfoView
    age_s: float
    delivering_pages: int
    reported: bool
    report_age_s: float
    report: ClientReport
    evictions_per_s: float
    restores_per_s: float
    evict_requests: int
    evict_pages_asked: int
    evict_pages_returned: int
    deadline_misses: int
    quota_rejections: int
    leases: int
    pages_leased: int
    pages_returned: int


@dataclass(frozen=True)
class PrincipalView:
    quota: Quota
    sessions: int
    leased_pages: int
    evicted_bytes: int
    quota_rejections: int


@dataclass(frozen=True)
class DeviceView:
    backend: str
    device: int
    page_bytes: int
    capacity_pages: int
    leased_pages: int
    delivering_pages: int
    free_pages: int
    evicted_pages: int
    evicted_bytes: int
    host_capacity_bytes: int
    inherited_pages: int = 0           # held by live clients of a previous daemon (not leasable)
    inherited_processes: int = 0
    paused_bytes: int = 0              # reported by clients: bytes of their paused regions


@dataclass(frozen=True)
class NodeView:
    uptime_s: float
    device: DeviceView
    sessions: tuple[SessionView, ...]
    principals: tuple[PrincipalView, ...]
    counters: dict[str, int]
    admin_view: bool
    hidden_sessions: int
    observers: int


@dataclass(frozen=True)
class PageView:
    page_id: int
    session_id: str
    state: str
    use: str = "unknown"  # as the holding client last reported it (a PAGE_USES value)


@dataclass(frozen=True)
class SessionPagesView:
    session_id: str
    principal: str
    pid: int
    reported: bool
    report: ClientReport


@dataclass(frozen=True)
class PageMapView:
    device: DeviceView
    pages: tuple[PageView, ...]
    sessions: tuple[SessionPagesView, ...]
    hidden_pages: int
