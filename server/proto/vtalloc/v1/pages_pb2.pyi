from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PageState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAGE_STATE_UNSPECIFIED: _ClassVar[PageState]
    PAGE_STATE_DELIVERING: _ClassVar[PageState]
    PAGE_STATE_LEASED: _ClassVar[PageState]

class PageUse(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAGE_USE_UNKNOWN: _ClassVar[PageUse]
    PAGE_USE_RESIDENT: _ClassVar[PageUse]
    PAGE_USE_CACHED: _ClassVar[PageUse]
    PAGE_USE_UNMAPPED: _ClassVar[PageUse]
    PAGE_USE_IN_FLIGHT: _ClassVar[PageUse]
PAGE_STATE_UNSPECIFIED: PageState
PAGE_STATE_DELIVERING: PageState
PAGE_STATE_LEASED: PageState
PAGE_USE_UNKNOWN: PageUse
PAGE_USE_RESIDENT: PageUse
PAGE_USE_CACHED: PageUse
PAGE_USE_UNMAPPED: PageUse
PAGE_USE_IN_FLIGHT: PageUse

class Quota(_message.Message):
    __slots__ = ("principal", "min_bytes", "max_bytes")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    principal: str
    min_bytes: int
    max_bytes: int
    def __init__(self, principal: _Optional[str] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "pid", "uid", "principal", "kind", "backend", "device", "page_bytes", "capacity_bytes", "host_capacity_bytes", "quota", "leased_pages", "evict_deadline_s", "admin")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    LEASED_PAGES_FIELD_NUMBER: _ClassVar[int]
    EVICT_DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
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
    def __init__(self, session_id: _Optional[str] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ..., principal: _Optional[str] = ..., kind: _Optional[str] = ..., backend: _Optional[str] = ..., device: _Optional[int] = ..., page_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., host_capacity_bytes: _Optional[int] = ..., quota: _Optional[_Union[Quota, _Mapping]] = ..., leased_pages: _Optional[int] = ..., evict_deadline_s: _Optional[float] = ..., admin: _Optional[bool] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("pages",)
    PAGES_FIELD_NUMBER: _ClassVar[int]
    pages: int
    def __init__(self, pages: _Optional[int] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("lease_id", "page_ids")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, lease_id: _Optional[int] = ..., page_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReturnRequest(_message.Message):
    __slots__ = ("page_ids", "evict_request_id")
    PAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    EVICT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    page_ids: _containers.RepeatedScalarFieldContainer[int]
    evict_request_id: int
    def __init__(self, page_ids: _Optional[_Iterable[int]] = ..., evict_request_id: _Optional[int] = ...) -> None: ...

class ReturnReply(_message.Message):
    __slots__ = ("returned",)
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    returned: int
    def __init__(self, returned: _Optional[int] = ...) -> None: ...

class PageUseReport(_message.Message):
    __slots__ = ("page_id", "use")
    PAGE_ID_FIELD_NUMBER: _ClassVar[int]
    USE_FIELD_NUMBER: _ClassVar[int]
    page_id: int
    use: PageUse
    def __init__(self, page_id: _Optional[int] = ..., use: _Optional[_Union[PageUse, str]] = ...) -> None: ...

class RegionReport(_message.Message):
    __slots__ = ("tag", "bytes", "paused_bytes", "host_bytes")
    TAG_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PAUSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    tag: str
    bytes: int
    paused_bytes: int
    host_bytes: int
    def __init__(self, tag: _Optional[str] = ..., bytes: _Optional[int] = ..., paused_bytes: _Optional[int] = ..., host_bytes: _Optional[int] = ...) -> None: ...

class ClientReport(_message.Message):
    __slots__ = ("allocated_bytes", "active_bytes", "mapped_bytes", "cached_bytes", "pages_total", "pages_resident", "pages_cached", "pages_free", "evicted_bytes", "evicted_pages", "evictions_total", "restores_total", "ooms_total", "page_uses", "paused_bytes", "regions")
    ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGES_RESIDENT_FIELD_NUMBER: _ClassVar[int]
    PAGES_CACHED_FIELD_NUMBER: _ClassVar[int]
    PAGES_FREE_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESTORES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    OOMS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGE_USES_FIELD_NUMBER: _ClassVar[int]
    PAUSED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    allocated_bytes: int
    active_bytes: int
    mapped_bytes: int
    cached_bytes: int
    pages_total: int
    pages_resident: int
    pages_cached: int
    pages_free: int
    evicted_bytes: int
    evicted_pages: int
    evictions_total: int
    restores_total: int
    ooms_total: int
    page_uses: _containers.RepeatedCompositeFieldContainer[PageUseReport]
    paused_bytes: int
    regions: _containers.RepeatedCompositeFieldContainer[RegionReport]
    def __init__(self, allocated_bytes: _Optional[int] = ..., active_bytes: _Optional[int] = ..., mapped_bytes: _Optional[int] = ..., cached_bytes: _Optional[int] = ..., pages_total: _Optional[int] = ..., pages_resident: _Optional[int] = ..., pages_cached: _Optional[int] = ..., pages_free: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., evicted_pages: _Optional[int] = ..., evictions_total: _Optional[int] = ..., restores_total: _Optional[int] = ..., ooms_total: _Optional[int] = ..., page_uses: _Optional[_Iterable[_Union[PageUseReport, _Mapping]]] = ..., paused_bytes: _Optional[int] = ..., regions: _Optional[_Iterable[_Union[RegionReport, _Mapping]]] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("report",)
    REPORT_FIELD_NUMBER: _ClassVar[int]
    report: ClientReport
    def __init__(self, report: _Optional[_Union[ClientReport, _Mapping]] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("request_id", "pages", "deadline_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    pages: int
    deadline_s: float
    def __init__(self, request_id: _Optional[int] = ..., pages: _Optional[int] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class QuotaChanged(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: Quota
    def __init__(self, quota: _Optional[_Union[Quota, _Mapping]] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("evict", "quota", "shutdown")
    EVICT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    evict: EvictRequest
    quota: QuotaChanged
    shutdown: Shutdown
    def __init__(self, evict: _Optional[_Union[EvictRequest, _Mapping]] = ..., quota: _Optional[_Union[QuotaChanged, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeviceStats(_message.Message):
    __slots__ = ("backend", "device", "page_bytes", "capacity_pages", "leased_pages", "delivering_pages", "free_pages", "evicted_pages", "evicted_bytes", "host_capacity_bytes", "inherited_pages", "inherited_processes", "paused_bytes")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_PAGES_FIELD_NUMBER: _ClassVar[int]
    LEASED_PAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERING_PAGES_FIELD_NUMBER: _ClassVar[int]
    FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_PAGES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    INHERITED_PAGES_FIELD_NUMBER: _ClassVar[int]
    INHERITED_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    PAUSED_BYTES_FIELD_NUMBER: _ClassVar[int]
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
    inherited_pages: int
    inherited_processes: int
    paused_bytes: int
    def __init__(self, backend: _Optional[str] = ..., device: _Optional[int] = ..., page_bytes: _Optional[int] = ..., capacity_pages: _Optional[int] = ..., leased_pages: _Optional[int] = ..., delivering_pages: _Optional[int] = ..., free_pages: _Optional[int] = ..., evicted_pages: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., host_capacity_bytes: _Optional[int] = ..., inherited_pages: _Optional[int] = ..., inherited_processes: _Optional[int] = ..., paused_bytes: _Optional[int] = ...) -> None: ...

class SessionStats(_message.Message):
    __slots__ = ("info", "age_s", "delivering_pages", "reported", "report_age_s", "report", "evictions_per_s", "restores_per_s", "evict_requests", "evict_pages_asked", "evict_pages_returned", "deadline_misses", "quota_rejections", "leases", "pages_leased", "pages_returned")
    INFO_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    DELIVERING_PAGES_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    REPORT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_PER_S_FIELD_NUMBER: _ClassVar[int]
    RESTORES_PER_S_FIELD_NUMBER: _ClassVar[int]
    EVICT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    EVICT_PAGES_ASKED_FIELD_NUMBER: _ClassVar[int]
    EVICT_PAGES_RETURNED_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MISSES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    PAGES_LEASED_FIELD_NUMBER: _ClassVar[int]
    PAGES_RETURNED_FIELD_NUMBER: _ClassVar[int]
    info: SessionInfo
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
    def __init__(self, info: _Optional[_Union[SessionInfo, _Mapping]] = ..., age_s: _Optional[float] = ..., delivering_pages: _Optional[int] = ..., reported: _Optional[bool] = ..., report_age_s: _Optional[float] = ..., report: _Optional[_Union[ClientReport, _Mapping]] = ..., evictions_per_s: _Optional[float] = ..., restores_per_s: _Optional[float] = ..., evict_requests: _Optional[int] = ..., evict_pages_asked: _Optional[int] = ..., evict_pages_returned: _Optional[int] = ..., deadline_misses: _Optional[int] = ..., quota_rejections: _Optional[int] = ..., leases: _Optional[int] = ..., pages_leased: _Optional[int] = ..., pages_returned: _Optional[int] = ...) -> None: ...

class PrincipalStats(_message.Message):
    __slots__ = ("quota", "sessions", "leased_pages", "evicted_bytes", "quota_rejections")
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LEASED_PAGES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    quota: Quota
    sessions: int
    leased_pages: int
    evicted_bytes: int
    quota_rejections: int
    def __init__(self, quota: _Optional[_Union[Quota, _Mapping]] = ..., sessions: _Optional[int] = ..., leased_pages: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., quota_rejections: _Optional[int] = ...) -> None: ...

class Counters(_message.Message):
    __slots__ = ("sessions_total", "leases_total", "pages_leased_total", "pages_returned_total", "quota_rejections_total", "node_short_rejections_total", "evict_requests_total", "evict_pages_asked_total", "evict_pages_returned_total", "deadline_misses_total", "kills_total", "reclaims_total", "reclaimed_pages_total", "evictions_total", "restores_total", "protocol_errors_total")
    SESSIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LEASES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGES_LEASED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PAGES_RETURNED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REJECTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NODE_SHORT_REJECTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EVICT_REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EVICT_PAGES_ASKED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EVICT_PAGES_RETURNED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MISSES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KILLS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RECLAIMS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RECLAIMED_PAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESTORES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    sessions_total: int
    leases_total: int
    pages_leased_total: int
    pages_returned_total: int
    quota_rejections_total: int
    node_short_rejections_total: int
    evict_requests_total: int
    evict_pages_asked_total: int
    evict_pages_returned_total: int
    deadline_misses_total: int
    kills_total: int
    reclaims_total: int
    reclaimed_pages_total: int
    evictions_total: int
    restores_total: int
    protocol_errors_total: int
    def __init__(self, sessions_total: _Optional[int] = ..., leases_total: _Optional[int] = ..., pages_leased_total: _Optional[int] = ..., pages_returned_total: _Optional[int] = ..., quota_rejections_total: _Optional[int] = ..., node_short_rejections_total: _Optional[int] = ..., evict_requests_total: _Optional[int] = ..., evict_pages_asked_total: _Optional[int] = ..., evict_pages_returned_total: _Optional[int] = ..., deadline_misses_total: _Optional[int] = ..., kills_total: _Optional[int] = ..., reclaims_total: _Optional[int] = ..., reclaimed_pages_total: _Optional[int] = ..., evictions_total: _Optional[int] = ..., restores_total: _Optional[int] = ..., protocol_errors_total: _Optional[int] = ...) -> None: ...

class NodeStats(_message.Message):
    __slots__ = ("version", "uptime_s", "device", "sessions", "principals", "counters", "admin_view", "hidden_sessions", "observers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPALS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_VIEW_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    OBSERVERS_FIELD_NUMBER: _ClassVar[int]
    version: str
    uptime_s: float
    device: DeviceStats
    sessions: _containers.RepeatedCompositeFieldContainer[SessionStats]
    principals: _containers.RepeatedCompositeFieldContainer[PrincipalStats]
    counters: Counters
    admin_view: bool
    hidden_sessions: int
    observers: int
    def __init__(self, version: _Optional[str] = ..., uptime_s: _Optional[float] = ..., device: _Optional[_Union[DeviceStats, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[SessionStats, _Mapping]]] = ..., principals: _Optional[_Iterable[_Union[PrincipalStats, _Mapping]]] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ..., admin_view: _Optional[bool] = ..., hidden_sessions: _Optional[int] = ..., observers: _Optional[int] = ...) -> None: ...

class ListPagesRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class PageEntry(_message.Message):
    __slots__ = ("page_id", "session_id", "state", "use")
    PAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    USE_FIELD_NUMBER: _ClassVar[int]
    page_id: int
    session_id: str
    state: PageState
    use: PageUse
    def __init__(self, page_id: _Optional[int] = ..., session_id: _Optional[str] = ..., state: _Optional[_Union[PageState, str]] = ..., use: _Optional[_Union[PageUse, str]] = ...) -> None: ...

class SessionPages(_message.Message):
    __slots__ = ("session_id", "principal", "pid", "reported", "report")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    principal: str
    pid: int
    reported: bool
    report: ClientReport
    def __init__(self, session_id: _Optional[str] = ..., principal: _Optional[str] = ..., pid: _Optional[int] = ..., reported: _Optional[bool] = ..., report: _Optional[_Union[ClientReport, _Mapping]] = ...) -> None: ...

class PageMap(_message.Message):
    __slots__ = ("device", "pages", "sessions", "hidden_pages")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_PAGES_FIELD_NUMBER: _ClassVar[int]
    device: DeviceStats
    pages: _containers.RepeatedCompositeFieldContainer[PageEntry]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionPages]
    hidden_pages: int
    def __init__(self, device: _Optional[_Union[DeviceStats, _Mapping]] = ..., pages: _Optional[_Iterable[_Union[PageEntry, _Mapping]]] = ..., sessions: _Optional[_Iterable[_Union[SessionPages, _Mapping]]] = ..., hidden_pages: _Optional[int] = ...) -> None: ...
