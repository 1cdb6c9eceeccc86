"""Hostile clients of the daemon (issue 11): untrusted reports, oversized echoes, odd hellos,
and the eviction deadline a client is told.

Each test here failed before its fix: reports of 2**64-1 broke GetStats and ListPages for
everyone (2), the deadline sent was the configured one plus the kill wait (8), a deeply
nested hello escaped the connection's task and a 1 MiB session id turned NOT_FOUND into
RESOURCE_EXHAUSTED (9), and ``{"v": true}`` passed as protocol version 1 (11).
"""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from helpers.service import Daemon, Observer, wait_until
from helpers.sizes import PAGE
from helpers.ledger_checks import node_counters

from vtalloc.allocator import InvalidArgumentError
from vtalloc.client.session import ServiceSession
from vtalloc.server.errors import NotFoundError, NodeShortError
from vtalloc.server.ledger import ClientReport, Ledger, NodeGeometry
from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2
from vtalloc.server.protocol.rpc import MAX_REPORT_VALUE
from vtalloc.server.protocol.side_channel import MAX_MESSAGE_BYTES
from vtalloc.server.service import to_message

U64_MAX = 2 ** 64 - 1


@pytest.fixture(scope="module")
def daemon():
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB")) as d:
        yield d


def lease_and_keep(s: ServiceSession, pages: int) -> list[int]:
    """Lease ``pages`` on a raw session; the descriptors are closed (the daemon still counts them ours)."""
    reply = s.call(s.pages, "Lease", pages_pb2.LeaseRequest(pages=pages), 10)
    got: list[int] = []
    while len(got) < pages:
        msg, fds = s.recv_pages(5)
        for fd in fds:
            os.close(fd)
        got += msg["page_ids"]
    assert got == list(reply.page_ids)
    return got


def report(s: ServiceSession, **values: int) -> None:
    s.call(s.pages, "Report", pages_pb2.ReportRequest(report=pages_pb2.ClientReport(**values)))


def protocol_errors(obs: Observer) -> int:
    return obs.stats().counters.protocol_errors_total


# -- 2: client reports are untrusted ---------------------------------------------------------------

def test_reports_out_of_range_are_refused_and_stats_keep_working(daemon):
    with Observer(daemon.address) as obs, ServiceSession(daemon.address) as a, ServiceSession(daemon.address) as b:
        lease_and_keep(a, 1)
        before = protocol_errors(obs)
        for s in (a, b):
            for value in (U64_MAX, 0, U64_MAX):  # the sequence: drives a counter past 2**64
                try:
                    report(s, evictions_total=value, evicted_bytes=value)
                except InvalidArgumentError as e:
                    assert "evicted_bytes" in str(e) and str(MAX_REPORT_VALUE) in str(e)
                    continue
                assert value == 0, "a report of 2**64-1 was accepted"
        assert protocol_errors(obs) == before + 4  # each refusal is counted
        stats = obs.stats()  # INTERNAL ("Value out of range") before the fix
        assert stats.counters.evictions_total <= U64_MAX
        obs.session.call(obs.session.pages, "ListPages", pages_pb2.ListPagesRequest())
        # The largest value in range is taken as it is.
        report(a, evictions_total=MAX_REPORT_VALUE, evicted_bytes=MAX_REPORT_VALUE)
        mine = next(x for x in obs.stats().sessions if x.info.session_id == a.session_id)
        assert mine.report.evicted_bytes == MAX_REPORT_VALUE


def test_a_report_out_of_range_is_refused_by_the_ledger_and_changes_nothing():
    ledger = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0))
    s = ledger.sessions.open(10, 1, 1, "client")
    ledger.reports.record(s, ClientReport(evictions_total=5, evicted_bytes=PAGE))
    for field in ("allocated_bytes", "evicted_bytes", "evictions_total", "restores_total", "ooms_total"):
        with pytest.raises(InvalidArgumentError, match=field):
            ledger.reports.record(s, ClientReport(**{field: MAX_REPORT_VALUE + 1}))
    with pytest.raises(InvalidArgumentError):
        ledger.reports.record(s, ClientReport(evicted_pages=-1))
    assert node_counters(ledger)["protocol_errors_total"] == 6
    assert node_counters(ledger)["evictions_total"] == 5
    assert ledger.views.node_view(None).sessions[0].report.evicted_bytes == PAGE


def test_node_counters_and_sums_saturate_at_the_protos_uint64():
    """Values in range still add up past 2**64 over many reports or sessions: the node's
    counters and sums stop at 2**64-1, and every view still fills its proto message."""
    ledger = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0))
    sessions = [ledger.sessions.open(10, 1, 1, "client") for _ in range(U64_MAX // MAX_REPORT_VALUE + 2)]
    for s in sessions:
        ledger.reports.record(s, ClientReport(evicted_bytes=MAX_REPORT_VALUE, evicted_pages=MAX_REPORT_VALUE))
    hog = sessions[0]
    for _ in range(U64_MAX // MAX_REPORT_VALUE + 2):
        ledger.reports.record(hog, ClientReport(evictions_total=0, restores_total=0))
        ledger.reports.record(hog, ClientReport(evictions_total=MAX_REPORT_VALUE, restores_total=MAX_REPORT_VALUE))
    counters = node_counters(ledger)
    assert counters["evictions_total"] == counters["restores_total"] == U64_MAX
    view = ledger.views.node_view(None)
    assert view.device.evicted_bytes == view.device.evicted_pages == U64_MAX
    assert view.principals[0].evicted_bytes == U64_MAX
    to_message(pages_pb2.NodeStats(), view)          # ValueError: Value out of range, before the fix
    to_message(pages_pb2.PageMap(), ledger.views.page_map(None))
    ledger.reports.record(hog, ClientReport(evictions_total=MAX_REPORT_VALUE))
    assert node_counters(ledger)["evictions_total"] == U64_MAX  # stays saturated


# -- 8: the eviction deadline a client is told ----------------------------------------------------

def test_an_eviction_request_carries_the_configured_deadline(daemon):
    """The daemon tells a client the deadline it judges it by: --evict-deadline, not that plus the kill wait."""
    with ServiceSession(daemon.address) as holder, ServiceSession(daemon.address) as asker:
        lease_and_keep(holder, holder.hello.capacity_bytes // holder.hello.page_bytes)  # the whole node
        events = holder.watch(30)
        got: list[pages_pb2.Event] = []
        reader = threading.Thread(target=lambda: got.append(next(iter(events))), daemon=True)
        reader.start()
        wait_until(lambda: reader.is_alive(), 5)
        with pytest.raises(NodeShortError):   # the holder never answers: the borrowing lease fails
            asker.call(asker.pages, "Lease", pages_pb2.LeaseRequest(pages=1), 30)
        reader.join(5)
        events.cancel()
        assert got and got[0].HasField("evict")
        assert 0 < got[0].evict.deadline_s <= daemon.evict_deadline
        assert got[0].evict.deadline_s > daemon.evict_deadline - 0.5


# -- 9: hostile side-channel hellos and oversized echoes ------------------------------------------

def hello_answer(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sk:
        sk.connect(path)
        sk.send(data)
        sk.settimeout(5)
        return sk.recv(MAX_MESSAGE_BYTES)


def test_a_deeply_nested_hello_is_a_protocol_error_and_the_daemon_serves_on(daemon):
    path = daemon.ready["side_channel"]
    head, tail = b'{"t":"hello","v":1,"kind":"client","x":', b"}"
    depth = (MAX_MESSAGE_BYTES - len(head) - len(tail)) // 2
    nested = head + b"[" * depth + b"]" * depth + tail
    assert len(nested) <= MAX_MESSAGE_BYTES
    with Observer(daemon.address) as obs:
        before = protocol_errors(obs)
        for data in (nested, b"[" * MAX_MESSAGE_BYTES):
            assert hello_answer(path, data) == b""  # dropped, no session
        assert protocol_errors(obs) == before + 2
        with ServiceSession(daemon.address) as s:  # everyone else is still served
            lease_and_keep(s, 1)
    log = daemon.log()
    assert "RecursionError" not in log and "never retrieved" not in log
    assert "dropped" in log  # logged as a dropped peer


def test_a_hello_whose_version_is_not_an_integer_is_refused(daemon):
    path = daemon.ready["side_channel"]
    with Observer(daemon.address) as obs:
        before = protocol_errors(obs)
        for v in ("true", "1.0", '"1"'):
            assert hello_answer(path, b'{"t":"hello","v":%s,"kind":"observer"}' % v.encode()) == b""
        assert protocol_errors(obs) == before + 3
        answer = json.loads(hello_answer(path, b'{"t":"hello","v":1,"kind":"observer"}'))
        assert answer["t"] == "session"


def test_errors_echo_a_bounded_part_of_what_the_request_said(daemon):
    huge = "s" * (1 << 20)
    with Observer(daemon.address) as obs:
        s = obs.session
        for method, request in (("GetStats", pages_pb2.GetStatsRequest(session_id=huge)),
                                ("ListPages", pages_pb2.ListPagesRequest(session_id=huge))):
            with pytest.raises(NotFoundError) as e:  # RESOURCE_EXHAUSTED before the fix
                s.call(s.pages, method, request, 10)
            assert len(str(e.value)) < 400 and str(len(huge)) in str(e.value)
        with pytest.raises(InvalidArgumentError) as e:
            s.call(s.admin, "SetQuota", admin_pb2.SetQuotaRequest(principal=huge, max_bytes=PAGE), 10)
        assert len(str(e.value)) < 400 and str(len(huge)) in str(e.value)
    with ServiceSession(daemon.address) as c:
        lease_and_keep(c, 1)
