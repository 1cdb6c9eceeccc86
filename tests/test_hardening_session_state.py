"""Issue 38, round three: what one session (or one member of a principal) can make the daemon
hold or do is bounded, and a declaration binds only its own uid.

- item 3: a session's event queue is bounded however many events others cause and however
  long it does not watch (server/node_events.py, Note [Bounded event queues]);
- item 7: a quota declared by one member of a shared principal binds only that member's uid
  (server/ledger_quotas.py, Note [Declared quotas bind their own uid]);
- item 8: a Report (or a Return) names at most the pages its session holds, checked before any
  work is done with it (server/reports.py);
- item 9: a principal is matched whole: ``'uid:1\\n'`` is no principal.

Each test failed on the code before its fix (3: the daemon grew by tens of MiB and the queue
held every event; 7: the other member's lease was QuotaExceededError; 8: a report of 690,000
page uses was accepted; 9: ``'uid:1\\n'`` and ``'team\\n'`` were accepted as principals).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
from helpers.service import NOGROUP, ClientProc, Daemon, Observer
from helpers.sizes import PAGE
from helpers.users import made_users, needs_users
from helpers.ledger_checks import node_counters
from hypothesis import given
from hypothesis import strategies as st

from vtalloc.allocator import InvalidArgumentError
from vtalloc.client.session import ServiceSession
from vtalloc.server.ledger import Ledger, NodeGeometry
from vtalloc.server.node import Node, Peer
from vtalloc.server.node_events import MAX_EVICT_EVENTS, EventBox, EvictEvent, QuotaEvent, ShutdownEvent
from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2
from vtalloc.server.protocol.side_channel import PROTOCOL_VERSION, encode
from vtalloc.server.quota import PrincipalMap, Quota, check_principal


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def declaring_hello(side_channel: str, max_bytes: int) -> None:
    """A client hello that declares a quota, then goodbye: what the attack repeats."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(side_channel)
        s.send(encode({"t": "hello", "v": PROTOCOL_VERSION, "kind": "client",
                       "quota": {"min": 0, "max": max_bytes}}))
        s.settimeout(5)
        assert b'"session"' in s.recv(8192)
        s.send(encode({"t": "bye"}))


# -- item 3: bounded per-session event queues --------------------------------------------------------

def test_hellos_in_a_loop_do_not_grow_the_daemon_whose_sessions_never_watch():
    """Before: each declaring hello queued a quota event for every session of the principal,
    unbounded; 200 idle sessions and 1,000 hellos grew the daemon by about 20 MiB (hellos are
    paced to 100 a second per uid now: this takes about 15 s)."""
    with Daemon(capacity="16MiB") as d:
        idle = [ServiceSession(d.address, timeout_s=5) for _ in range(200)]   # never watch
        try:
            for i in range(200):                       # warm-up: the daemon's own caches settle
                declaring_hello(d.ready["side_channel"], (64 << 20) + i)
            before = rss_bytes(d.pid)
            for i in range(1000):
                declaring_hello(d.ready["side_channel"], (64 << 20) + i)
            grown = rss_bytes(d.pid) - before
            assert grown < 8 << 20, f"the daemon grew by {grown >> 20} MiB"
            with Observer(d.address) as obs:           # and it serves on
                assert obs.stats().device.capacity_pages == 8
        finally:
            for s in idle:
                s.close()


def _event(kind: int, i: int) -> object:
    if kind == 0:
        return EvictEvent(i, 1, 1.0)
    if kind == 1:
        return QuotaEvent(Quota("uid:1", 0, i * PAGE))
    return ShutdownEvent(f"stop {i}")


@given(st.lists(st.integers(0, 2), max_size=3000))
def test_an_event_box_holds_a_bounded_number_of_events_and_the_latest_quota(kinds):
    """The invariant, for any sequence of events nobody reads: at most MAX_EVICT_EVENTS eviction
    requests, one quota (the latest), one shutdown (the first); reading gives them in that order."""
    async def main() -> list[object]:
        box = EventBox()
        for i, kind in enumerate(kinds):
            box.put(_event(kind, i))
            assert box.held() <= MAX_EVICT_EVENTS + 2
        box.put(None)
        out = []
        while (e := await box.get()) is not None:
            out.append(e)
        return out

    out = asyncio.run(main())
    evicts = [e for e in out if isinstance(e, EvictEvent)]
    asked = [i for i, k in enumerate(kinds) if k == 0]
    assert [e.request_id for e in evicts] == asked[-MAX_EVICT_EVENTS:]
    quotas = [e for e in out if isinstance(e, QuotaEvent)]
    last_quota = max((i for i, k in enumerate(kinds) if k == 1), default=None)
    assert [q.quota.max_bytes for q in quotas] == ([] if last_quota is None else [last_quota * PAGE])
    shutdowns = [e for e in out if isinstance(e, ShutdownEvent)]
    first_stop = min((i for i, k in enumerate(kinds) if k == 2), default=None)
    assert [s.reason for s in shutdowns] == ([] if first_stop is None else [f"stop {first_stop}"])
    assert out == evicts + quotas + shutdowns


def test_quota_changes_leave_one_event_per_session_however_many():
    """The node's own path (quota_changed, as hellos and SetQuota call it) on sessions that never watch."""
    async def main():
        ledger = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0))
        node = Node(None, ledger)
        peers = []
        for pid in range(10, 20):
            s = ledger.sessions.open(pid, 1000, 1000, "client")
            peers.append(node.peers.add(Peer(s, None, None)))
        for i in range(5000):
            node.peers.quota_changed(ledger.quotas.set("uid:1000", 0, (i + 1) * PAGE))
        assert [p.events.held() for p in peers] == [1] * len(peers)
        assert (await peers[0].events.get()).quota.max_bytes == 5000 * PAGE

    asyncio.run(main())


# -- item 7: a declaration binds only its own uid ---------------------------------------------------

def test_a_members_declaration_binds_only_its_own_uid_in_the_ledger():
    ledger = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0), quotas=[Quota("team", 4 * PAGE, 12 * PAGE)],
                    principals=PrincipalMap(((1001, "team"), (1002, "team"))))
    other = ledger.sessions.open(20, 1002, 1002, "client")
    ids = list(range(1, 5))
    assert ledger.leases.admit(other, 4) == 0
    ledger.leases.add_pages(other, ids)
    ledger.leases.mark_delivered(other, ids)
    zero = ledger.sessions.open(21, 1001, 1001, "client", declared=(0, 0))
    assert ledger.quotas.for_session(zero) == Quota("team", 0, 0)
    assert ledger.quotas.for_session(other) == Quota("team", 4 * PAGE, 12 * PAGE)
    assert ledger.leases.admit(other, 2) == 0                   # not bound by 1001's 0:0
    with pytest.raises(Exception, match="declared"):
        ledger.leases.admit(zero, 1)                            # 1001 is
    assert ledger.quotas.excess_pages("team") == 0              # 1002's 4 pages stay guaranteed
    assert ledger.quotas.within_guarantee(other, 0)
    assert ledger.quotas.of("team") == Quota("team", 4 * PAGE, 12 * PAGE)  # what binds every member
    ledger.sessions.end(zero, clean=True)
    ledger.sessions.end(other, clean=True)


@needs_users
def test_one_member_of_a_shared_principal_cannot_set_the_others_quota_to_zero():
    """Before: uid A's session declaring VTALLOC_QUOTA_MIN=0 MAX=0 dropped the whole principal to
    0:0 while it lived, and uid B's next lease failed with QuotaExceededError."""
    with made_users(2) as (a, b):
        args = ("--group", "nogroup", "--principal", f"team={a.uid},{b.uid}", "--quota", f"team={4 * PAGE}:{8 * PAGE}")
        with Daemon(capacity=f"{16 * PAGE}", args=args) as d, \
                ClientProc(user=b.uid, group=NOGROUP) as member_b, \
                ClientProc(user=a.uid, group=NOGROUP, env={"VTALLOC_QUOTA_MIN": "0", "VTALLOC_QUOTA_MAX": "0"}) as zero:
            member_b.ok("raw_open", address=d.address)
            zero.ok("raw_open", address=d.address)
            assert zero.call("raw_lease", pages=1)["error"] == "QuotaExceededError"  # its own declaration holds
            assert len(member_b.ok("raw_lease", pages=3)["page_ids"]) == 3
            quota = member_b.ok("rpc", service="admin", method="GetQuota", request_type="GetQuotaRequest")["reply"]
            assert int(quota["quotas"][0]["max_bytes"]) == 8 * PAGE


# -- item 8: reports and returns are bounded by what the session holds, before any work ----------------

def test_a_report_naming_more_pages_than_its_session_holds_is_refused_before_any_work():
    with Daemon(capacity="16MiB") as d, Observer(d.address) as obs, ServiceSession(d.address, timeout_s=30) as s:
        reply = s.call(s.pages, "Lease", pages_pb2.LeaseRequest(pages=2), 10)
        _, fds = s.recv_pages(5)
        for fd in fds:
            os.close(fd)
        before = obs.stats().counters.protocol_errors_total
        huge = pages_pb2.ClientReport(page_uses=[pages_pb2.PageUseReport(page_id=i) for i in range(690_000)])  # 4 MiB
        t0 = time.monotonic()
        with pytest.raises(InvalidArgumentError, match="holds 2 pages"):
            s.call(s.pages, "Report", pages_pb2.ReportRequest(report=huge), 30)
        took = time.monotonic() - t0
        assert obs.stats().counters.protocol_errors_total == before + 1
        with pytest.raises(InvalidArgumentError, match="holds 2 pages"):
            s.call(s.pages, "Return", pages_pb2.ReturnRequest(page_ids=list(range(10**6, 10**6 + 65536))), 30)
        # What it holds is taken, and read back by the page map.
        uses = [pages_pb2.PageUseReport(page_id=p, use=pages_pb2.PAGE_USE_CACHED) for p in reply.page_ids]
        s.call(s.pages, "Report", pages_pb2.ReportRequest(report=pages_pb2.ClientReport(page_uses=uses)), 10)
        pm = obs.session.call(obs.session.pages, "ListPages", pages_pb2.ListPagesRequest())
        assert {p.page_id: p.use for p in pm.pages} == {p: pages_pb2.PAGE_USE_CACHED for p in reply.page_ids}
        assert took < 10, took


# -- item 9: principals are matched whole -----------------------------------------------------------

@pytest.mark.parametrize("name", ["uid:1\n", "team\n", "team\n\n", "uid:1\r", "pod:" + "0" * 32 + "\n"])
def test_a_principal_with_a_trailing_newline_is_refused(name):
    with pytest.raises(InvalidArgumentError):
        check_principal(name)


@given(st.text(max_size=70))
def test_a_principal_is_a_whole_match_or_refused(name):
    try:
        check_principal(name)
    except InvalidArgumentError:
        return
    assert "\n" not in name and "\r" not in name and 1 <= len(name) <= 64 + 4


def test_set_quota_refuses_a_principal_with_a_newline():
    with Daemon(capacity="16MiB") as d, Observer(d.address) as obs:
        s = obs.session
        for name in ("uid:1\n", "team\n"):
            with pytest.raises(InvalidArgumentError):
                s.call(s.admin, "SetQuota", admin_pb2.SetQuotaRequest(principal=name, max_bytes=PAGE), 10)
        q = s.call(s.admin, "GetQuota", admin_pb2.GetQuotaRequest(principal="*"), 10)
        assert [x.principal for x in q.quotas] == []


# -- pacing: one uid's session opens and calls have a rate, applied before any work ---------------

def test_a_rate_pacer_gives_each_caller_its_burst_then_its_rate():
    from vtalloc.server.limits import RatePacer

    now = [0.0]
    pacer = RatePacer(10.0, 5, max_wait_s=1.0, clock=lambda: now[0])
    assert [pacer.delay("a") for _ in range(5)] == [0.0] * 5            # the burst
    waits = [pacer.delay("a") for _ in range(10)]
    assert waits == pytest.approx([0.1 * k for k in range(1, 11)])      # then its rate: queued, not refused
    assert pacer.delay("a") is None                                      # more than max_wait_s: refused
    assert pacer.delay("b") == 0.0                                       # another caller is not held up
    now[0] = 10.0
    assert pacer.delay("a") == 0.0                                       # refilled


def test_one_uid_opening_sessions_in_a_loop_is_paced():
    """Before: nothing bounded how often one uid opened sessions; 300 hellos took well under a
    second and, in a loop with declared quotas, tripled another user's lease latency."""
    from vtalloc.server.limits import SESSIONS_BURST, SESSIONS_PER_S

    with Daemon(capacity="16MiB") as d:
        t0 = time.monotonic()
        for i in range(300):
            declaring_hello(d.ready["side_channel"], (64 << 20) + i)      # none refused: paced
        took = time.monotonic() - t0
        assert took >= 0.75 * (300 - SESSIONS_BURST) / SESSIONS_PER_S, took


def test_a_handler_is_charged_the_loop_time_it_runs_not_what_it_waits():
    from vtalloc.server.loop_share import LoopShare, timed

    async def handler() -> str:
        await asyncio.sleep(0.2)                 # waiting: free
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:         # running on the loop: charged
            pass
        await asyncio.sleep(0)
        return "done"

    charged: list[float] = []
    assert asyncio.run(timed(handler(), charged.append)) == "done"
    assert 0.04 <= sum(charged) < 0.15, sum(charged)

    now = [0.0]
    share = LoopShare(share=0.25, burst_s=1.0, max_wait_s=2.0, clock=lambda: now[0])
    assert share.wait("a") == 0.0
    share.charge("a", 1.2)                       # its burst and 0.2 s more: 0.8 s to wait
    assert share.wait("a") == pytest.approx(0.8) and share.wait("b") == 0.0
    share.charge("a", 1.0)
    assert share.wait("a") is None               # 4.8 s of debt: refused, not queued that long
    now[0] = 10.0
    assert share.wait("a") == 0.0


def test_cancelling_a_timed_handler_reaches_the_handler():
    from vtalloc.server.loop_share import timed

    seen: list[str] = []

    async def handler() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        task = asyncio.ensure_future(timed(handler(), lambda s: None))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert seen == ["cancelled"]


def test_the_rpc_limiter_charges_each_caller_its_handlers_loop_time_and_paces_only_it():
    """Before: calls were paced by count (500 a second), whatever each cost: eight threads of one
    uid calling GetStats (2 ms each) made another user's leases 4.4 times slower
    (benchmarks/bench_attack_latency.py, rpc_flood), and decoding a request (50 ms for a 4 MiB
    Report, refused at once after) was charged to no one. Now both are the caller's own debt."""
    import types

    import grpc

    from vtalloc.server.limits import RpcLimiter, RpcSlots
    from vtalloc.server.loop_share import CALL_COST_S, LoopShare
    from vtalloc.server.protocol.rpc import SESSION_KEY

    async def dear(request: object, context: object) -> str:
        await asyncio.sleep(0.01)                # waiting: not charged
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:         # 30 ms on the loop: charged
            pass
        return "ok"

    limiter = RpcLimiter(RpcSlots(per_uid=8, total=16), lambda token: ({"a": 1000, "b": 1001}[token], False),
                         LoopShare(share=0.25, burst_s=0.1, max_wait_s=60.0, clock=lambda: 0.0))  # no refill

    def decode(data: bytes) -> bytes:            # gRPC decodes on the loop, before the handler
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            pass
        return data

    async def continuation(details: object) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(dear, request_deserializer=decode)

    async def call(token: str) -> str:
        details = types.SimpleNamespace(method="/vtalloc.v1.Pages/GetStats",
                                        invocation_metadata=((SESSION_KEY, token),))
        handler = await limiter.intercept_service(continuation, details)
        return await handler.unary_unary(handler.request_deserializer(b"request"), None)

    async def main() -> None:
        for _ in range(5):                       # 5 x (20 + 30) ms against a burst of 100 ms
            assert await call("a") == "ok"
        # at least 5 x 50 ms - 100 ms in debt, refilled at 0.25 s a second: >= 0.6 s to wait
        assert 0.6 <= limiter.share.wait(1000) < 60 and limiter.share.wait(1001) == 0.0
        assert await call("b") == "ok"           # another caller: not held by a's debt
        assert limiter.slots.total == 0 and limiter.slots.per_uid.held(1000) == 0

    asyncio.run(main())
    assert CALL_COST_S > 0


def test_a_report_listing_too_many_regions_is_refused_before_any_region_is_read(monkeypatch):
    """Reports gained regions (at most MAX_REPORT_REGIONS) beside this round's bound on page uses;
    the count is checked with the page uses', before the handler builds anything of them. Before:
    the handler built every region (100,000 here) and only then was the report refused."""
    import types

    from vtalloc.server import service
    from vtalloc.server.protocol.rpc import MAX_REPORT_REGIONS, SESSION_KEY

    built: list[object] = []
    monkeypatch.setattr(service, "RegionReport", lambda *fields: built.append(fields))
    ledger = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0))
    s = ledger.sessions.open(10, 1, 1, "client")
    pages = service.PagesService(types.SimpleNamespace(ledger=ledger))
    context = types.SimpleNamespace(invocation_metadata=lambda: ((SESSION_KEY, s.token),))
    n = 100 * MAX_REPORT_REGIONS
    request = pages_pb2.ReportRequest(report=pages_pb2.ClientReport(
        regions=[pages_pb2.RegionReport(tag=f"t{i}") for i in range(n)]))
    with pytest.raises(InvalidArgumentError, match=f"lists {n} regions; at most {MAX_REPORT_REGIONS}"):
        asyncio.run(pages.Report(request, context))
    assert built == [] and node_counters(ledger)["protocol_errors_total"] == 1
