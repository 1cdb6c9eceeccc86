"""Issue 23, round two: gRPC calls count per caller before they count against the node's total
(server/limits.py, Note [Calls per uid]): no uid, with or without a session, can take every
--max-concurrent-rpcs slot, and admins' calls count only against their own uid."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.service import NOGROUP, ClientProc, Daemon, Observer
from helpers.spaces import PAGE

from vtalloc.client.session import ServiceSession
from vtalloc.server.limits import NO_SESSION, RpcSlots
from vtalloc.server.protocol.errors import LimitExceededError

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="clients of other uids need root to start")
UID_A = 1


def open_streams(make, n: int) -> tuple[list, list]:
    """Start ``n`` server streams; (those still open after a second, the codes of those that ended)."""
    calls = [make() for _ in range(n)]
    time.sleep(1.0)
    held = [c for c in calls if not c.done()]
    return held, [c.code() for c in calls if c.done()]


@needs_root
def test_calls_without_a_session_cannot_take_every_slot():
    """Before: 8 Health.Watch streams from anyone filled --max-concurrent-rpcs 8 and every
    call of every uid, root's too, got RESOURCE_EXHAUSTED."""
    args = ("--group", "nogroup", "--max-concurrent-rpcs", "8", "--max-rpcs-per-uid", "4")
    with Daemon(capacity="16MiB", args=args) as d, grpc.insecure_channel(d.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        held, refused = open_streams(lambda: health.Watch(health_pb2.HealthCheckRequest(), timeout=30), 12)
        try:
            assert len(held) == 4 and refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 8
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
                health_pb2.HealthCheckResponse.SERVING
            with Observer(d.address) as obs:                  # root, with a session
                assert obs.stats().device.capacity_pages == 8
            with ClientProc(user=UID_A, group=NOGROUP) as a:  # another uid leases and answers
                a.ok("open", address=d.address, batch=1)
                addr = a.ok("malloc", nbytes=2 * PAGE, seed=1)["addr"]
                assert a.ok("check", addr=addr, nbytes=2 * PAGE, seed=1)["intact"]
            assert "gRPC call without a session refused" in d.log()
        finally:
            for call in held:
                call.cancel()


def test_one_uid_holds_at_most_its_own_share_and_gets_its_slots_back():
    args = ("--max-rpcs-per-uid", "3")
    with Daemon(capacity="16MiB", args=args) as d:
        sessions = [ServiceSession(d.address, timeout_s=5) for _ in range(5)]
        try:
            held, refused = open_streams(iter(s.watch(30) for s in sessions).__next__, 5)
            assert len(held) == 3 and refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
            with pytest.raises(LimitExceededError, match="--max-rpcs-per-uid 3"):
                sessions[0].call(sessions[0].pages, "GetSession", _get_session())
            for call in held:
                call.cancel()
            for s in sessions:  # slots came back with the cancelled streams
                s.call(s.pages, "GetSession", _get_session())
        finally:
            for s in sessions:
                s.close()


def _get_session():
    from vtalloc.server.proto.vtalloc.v1 import pages_pb2

    return pages_pb2.GetSessionRequest()


def test_rpc_slots_count_per_caller_first_and_admins_only_per_uid():
    slots = RpcSlots(per_uid=2, total=3)
    slots.take(1000, False)
    slots.take(1000, False)
    with pytest.raises(LimitExceededError, match="--max-rpcs-per-uid 2"):
        slots.take(1000, False)
    slots.take(NO_SESSION, False)
    with pytest.raises(LimitExceededError, match="--max-concurrent-rpcs 3"):
        slots.take(1001, False)
    assert slots.per_uid.held(1001) == 0           # a refused call keeps nothing
    slots.take(0, True)                             # an admin is not starved by the others
    slots.take(0, True)
    with pytest.raises(LimitExceededError, match="--max-rpcs-per-uid 2"):
        slots.take(0, True)
    for caller, admin in ((1000, False), (1000, False), (NO_SESSION, False), (0, True), (0, True)):
        slots.vacate(caller, admin)
    assert slots.total == 0 and all(slots.per_uid.held(u) == 0 for u in (0, 1000, NO_SESSION))
