"""gRPC servicers for vtalloc.v1.Pages and vtalloc.v1.Admin: translation only.

Owns: turning requests into calls on the node and ledger, and their answers (the ledger's
frozen views) into messages. No rule lives here: validation, ownership, quotas and pressure
are in ledger.py and node.py, and errors become status codes in errors.py's interceptor.
Every call is authenticated by the session token in its metadata (protocol/rpc.py's SESSION_KEY).
"""

from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

import grpc

from .ledger import Ledger
from .node import EvictEvent, Node, QuotaEvent, ShutdownEvent
from .proto.vtalloc.v1 import admin_pb2, admin_pb2_grpc, pages_pb2, pages_pb2_grpc
from .protocol.rpc import session_token
from .quota import Quota
from .records import Session
from .reports import ReportedUses
from .views import PAGE_STATES, PAGE_USES, ClientReport, PageUseReport, RegionReport

__all__ = ["PagesService", "AdminService", "to_message"]

_USE_VALUES = {name: pages_pb2.PageUse.Value("PAGE_USE_" + name.upper()) for name in PAGE_USES}
_USE_NAMES = {v: k for k, v in _USE_VALUES.items()}  # an unknown enum number reads as "unknown"
_REPORT_COUNTS = tuple(f for f in dataclasses.fields(ClientReport) if f.name not in ("page_uses", "regions"))
_STATE_VALUES = {name: pages_pb2.PageState.Value("PAGE_STATE_" + name.upper())
                 for name in PAGE_STATES}


def _page_use(u: Any) -> PageUseReport:
    return PageUseReport(u.page_id, _USE_NAMES.get(u.use, "unknown"))


def to_message(msg: Any, view: Any) -> Any:
    """Fill ``msg`` from a frozen view whose field names are the message's (nested, repeated)."""
    items = view.items() if isinstance(view, dict) else ((f.name, getattr(view, f.name))
                                                        for f in dataclasses.fields(view))
    for name, value in items:
        if name == "state" and isinstance(value, str):
            setattr(msg, name, _STATE_VALUES[value])
        elif name == "use" and isinstance(value, str):
            setattr(msg, name, _USE_VALUES[value])
        elif dataclasses.is_dataclass(value) or isinstance(value, dict):
            to_message(getattr(msg, name), value)
        elif isinstance(value, tuple):
            for item in value:
                to_message(getattr(msg, name).add(), item)
        else:
            setattr(msg, name, value)
    return msg


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vtalloc")
    except PackageNotFoundError:
        return "unknown"


def _session(ledger: Ledger, context: grpc.aio.ServicerContext) -> Session:
    return ledger.sessions.authenticate(session_token(context.invocation_metadata()))


class PagesService(pages_pb2_grpc.PagesServicer):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.ledger = node.ledger
        self._version = _package_version()

    async def GetSession(self, request: pages_pb2.GetSessionRequest, context) -> pages_pb2.SessionInfo:
        s = _session(self.ledger, context)
        return to_message(pages_pb2.SessionInfo(), self.ledger.views.session_info(s))

    async def Lease(self, request: pages_pb2.LeaseRequest, context) -> pages_pb2.LeaseReply:
        s = _session(self.ledger, context)
        lease_id, ids = await self.node.leases.lease(s, request.pages, context.time_remaining())
        return pages_pb2.LeaseReply(lease_id=lease_id, page_ids=ids)

    async def Return(self, request: pages_pb2.ReturnRequest, context) -> pages_pb2.ReturnReply:
        s = _session(self.ledger, context)
        self.ledger.leases.admit_return(s, len(request.page_ids))  # bounded before any work
        n = self.node.leases.give_back(s, list(request.page_ids), request.evict_request_id)
        return pages_pb2.ReturnReply(returned=n)

    async def Report(self, request: pages_pb2.ReportRequest, context) -> pages_pb2.ReportReply:
        s = _session(self.ledger, context)
        r = request.report
        self.ledger.reports.admit(s, len(r.page_uses), len(r.regions))  # bounded before any work (reports.py)
        counts = {f.name: getattr(r, f.name) for f in _REPORT_COUNTS}
        regions = tuple(RegionReport(x.tag, x.bytes, x.paused_bytes, x.host_bytes) for x in r.regions)
        report = ClientReport(**counts, regions=regions)
        self.ledger.reports.record(s, report, ReportedUses(r.page_uses, _page_use, s.pages))
        return pages_pb2.ReportReply()

    async def Watch(self, request: pages_pb2.WatchRequest, context) -> AsyncIterator[pages_pb2.Event]:
        s = _session(self.ledger, context)
        async for event in self.node.peers.watch(s):
            if isinstance(event, EvictEvent):
                yield pages_pb2.Event(evict=pages_pb2.EvictRequest(
                    request_id=event.request_id, pages=event.pages, deadline_s=event.deadline_s))
            elif isinstance(event, QuotaEvent):
                yield pages_pb2.Event(quota=pages_pb2.QuotaChanged(quota=to_message(pages_pb2.Quota(), event.quota)))
            elif isinstance(event, ShutdownEvent):
                yield pages_pb2.Event(shutdown=pages_pb2.Shutdown(reason=event.reason))

    async def GetStats(self, request: pages_pb2.GetStatsRequest, context) -> pages_pb2.NodeStats:
        s = _session(self.ledger, context)
        msg = to_message(pages_pb2.NodeStats(), self.ledger.views.node_view(s, request.session_id))
        msg.version = self._version
        return msg

    async def ListPages(self, request: pages_pb2.ListPagesRequest, context) -> pages_pb2.PageMap:
        s = _session(self.ledger, context)
        return to_message(pages_pb2.PageMap(), self.ledger.views.page_map(s, request.session_id))


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.ledger = node.ledger

    async def GetQuota(self, request: admin_pb2.GetQuotaRequest, context) -> admin_pb2.QuotaList:
        s = _session(self.ledger, context)
        principal = request.principal or s.principal
        if principal == "*":
            self.ledger.sessions.require_admin(s, "listing every quota")
            quotas = self.ledger.quotas.all()
        else:
            if principal != s.principal:
                self.ledger.sessions.require_admin(s, "reading another principal's quota")
            # one's own: the quota in force for this session (its scope's declarations included)
            quotas = (self.ledger.quotas.for_session(s) if principal == s.principal else self.ledger.quotas.of(principal),)
        reply = admin_pb2.QuotaList(quotas=[to_message(pages_pb2.Quota(), q) for q in quotas])
        reply.default_quota.CopyFrom(to_message(pages_pb2.Quota(), self.ledger.quotas.default))
        return reply

    async def SetQuota(self, request: admin_pb2.SetQuotaRequest, context) -> pages_pb2.Quota:
        s = _session(self.ledger, context)
        self.ledger.sessions.require_admin(s, "setting a quota")
        q: Quota = self.ledger.quotas.set(request.principal, request.min_bytes, request.max_bytes)
        self.node.peers.quota_changed(q)
        return to_message(pages_pb2.Quota(), q)

    async def EvictSession(self, request: admin_pb2.EvictSessionRequest, context) -> admin_pb2.EvictSessionReply:
        s = _session(self.ledger, context)
        out = await self.node.pressure.evict_session(s, request.session_id, request.pages, request.kill_on_miss)
        return to_message(admin_pb2.EvictSessionReply(), out)
