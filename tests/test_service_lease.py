"""Leases against a real daemon: ServiceAddressSpace(...) grows on demand, gives back, honours quotas.

Every test talks to a real ``vtalloc serve --backend host`` process; the clients are this
process (ServiceAddressSpace(...)) or real client processes (tests/helpers/service_client.py).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers.service import ClientProc, Daemon, Observer, wait_until
from helpers.spaces import MiB, PAGE, pattern

from vtalloc.allocator import AddressSpace, OutOfMemoryError
from vtalloc.client.service_space import ServiceAddressSpace
from vtalloc.server.errors import QuotaExceededError, ServiceUnavailableError



@pytest.fixture(scope="module")
def daemon():
    with Daemon(capacity="64MiB", args=("--metrics-port", "0")) as d:
        yield d


def session_view(obs: Observer, session_id: str):
    return next(s for s in obs.stats().sessions if s.info.session_id == session_id)


def test_a_service_space_is_an_address_space_that_leases_on_demand_and_gives_back(daemon):
    with Observer(daemon.address) as obs, \
            ServiceAddressSpace(daemon.address, lease_batch_pages=2, keep_free_pages=0) as space:
        assert isinstance(space.space, AddressSpace) and not isinstance(space, AddressSpace)  # holds one, is not one
        assert space.backend == "host" and space.page_bytes == PAGE and space.leased
        assert space.stats().pages_total == 0  # nothing leased before it is needed
        big = space.malloc(7 * MiB)            # 4 pages: leased on demand
        small = space.malloc(1000)             # on big's last page, which they share
        space.write(big, pattern(1, 7 * MiB))
        space.write(small, pattern(2, 1000))
        held = space.stats().pages_total
        assert held >= 4
        assert session_view(obs, space.session.session_id).info.leased_pages == held
        space.free(big)                         # above the spare margin: pages go back at once
        assert space.read(small, 1000) == pattern(2, 1000)
        after_free = space.stats().pages_total
        assert after_free < held
        assert session_view(obs, space.session.session_id).info.leased_pages == after_free
        mid = space.malloc(3 * MiB)             # 2 pages, freed within the spare margin: they stay leased
        space.free(mid)
        cached = space.stats().pages_total - 1
        assert cached >= 2
        assert space.trim() == cached * PAGE    # trim gives every page but the small one's back, in bytes
        assert space.stats().pages_total == 1   # only the page under the live small allocation
        assert session_view(obs, space.session.session_id).info.leased_pages == 1
        sid = space.session.session_id
    with Observer(daemon.address) as obs_after:
        stats = obs_after.stats()
    assert sid not in {s.info.session_id for s in stats.sessions}
    assert stats.device.free_pages == stats.device.capacity_pages
    assert stats.counters.reclaims_total == 0  # a clean close is not a crash


def test_a_lease_past_the_quota_maximum_fails_at_once_with_nothing_lost():
    with Daemon(capacity="64MiB", args=("--default-quota", "0:8MiB")) as d, \
            ServiceAddressSpace(d.address, lease_batch_pages=1) as space:
        keep = space.malloc(3 * PAGE)
        space.write(keep, pattern(3, 3 * PAGE))
        held = space.stats().pages_total
        t0 = time.monotonic()
        with pytest.raises(QuotaExceededError) as e:
            space.malloc(2 * PAGE)
        assert time.monotonic() - t0 < 1.0
        assert isinstance(e.value, OutOfMemoryError) and isinstance(e.value, MemoryError)
        assert space.stats().pages_total == held
        assert space.read(keep, 3 * PAGE) == pattern(3, 3 * PAGE)
        space.malloc(PAGE)  # what fits the quota still works
        with Observer(d.address) as obs:
            s = obs.stats()
            assert s.counters.quota_rejections_total >= 1
            assert s.principals[0].quota.max_bytes == 8 * MiB


def test_the_client_ceiling_caps_the_lease(daemon):
    with ServiceAddressSpace(daemon.address, capacity="4MiB") as space:
        assert space.capacity_bytes == 4 * MiB
        with pytest.raises(OutOfMemoryError):
            space.malloc(6 * MiB)
        a = space.malloc(4 * MiB)
        space.free(a)


def test_mismatched_options_are_refused_before_anything_is_leased(daemon):
    from vtalloc.allocator import InvalidArgumentError

    for kw in ({"backend": "cuda"}, {"page_size": "4MiB"}, {"device": 3}, {"lease_batch_pages": 0},
               {"leased": False}):
        with pytest.raises(InvalidArgumentError):
            ServiceAddressSpace(daemon.address, **kw)


def test_no_daemon_is_a_clear_error_not_a_hang(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailableError):
        ServiceAddressSpace(f"unix://{tmp_path}/none.sock")
    assert time.monotonic() - t0 < 2.0


def test_two_client_processes_show_up_live_in_stats(daemon):
    with ClientProc() as a, ClientProc() as b, Observer(daemon.address) as obs:
        sa = a.ok("open", address=daemon.address)["session_id"]
        sb = b.ok("open", address=daemon.address)["session_id"]
        a.ok("malloc", nbytes=3 * PAGE, seed=1)
        b.ok("malloc", nbytes=5 * PAGE, seed=2)

        def reported():
            s = {x.info.session_id: x for x in obs.stats().sessions}
            return sa in s and sb in s and s[sa].reported and s[sb].reported and \
                s[sa].report.pages_resident == 3 and s[sb].report.pages_resident == 5 and s

        s = wait_until(reported, 5)
        assert s[sa].info.pid == a.pid and s[sb].info.pid == b.pid
        assert s[sa].info.leased_pages >= 3 and s[sb].info.leased_pages >= 5
        assert obs.stats().device.leased_pages == s[sa].info.leased_pages + s[sb].info.leased_pages


def test_prometheus_metrics_use_base_units_and_total_counters(daemon):
    with ServiceAddressSpace(daemon.address, lease_batch_pages=1) as space:
        space.malloc(2 * PAGE)
        held = space.stats().pages_total
        text = urllib.request.urlopen(daemon.ready["metrics"], timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    node = 'backend="host",device="0"'
    assert values[f'vtalloc_pages{{{node},state="leased"}}'] == held
    assert values[f"vtalloc_capacity_bytes{{{node}}}"] == 64 * MiB and values[f"vtalloc_page_bytes{{{node}}}"] == PAGE
    assert values[f'vtalloc_principal_leased_bytes{{{node},principal="uid:0"}}'] == held * PAGE
    values = {name.split("{")[0]: value for name, value in values.items()}
    for counter in ("vtalloc_reclaims_total", "vtalloc_evictions_total", "vtalloc_restores_total",
                    "vtalloc_quota_rejections_total", "vtalloc_evict_requests_total", "vtalloc_leased_pages_total"):
        assert counter in values
    assert values["vtalloc_leased_pages_total"] >= held
    assert "# TYPE vtalloc_reclaims_total counter" in text or "# TYPE vtalloc_reclaims counter" in text


def test_health_checking_and_reflection_are_on(daemon):
    with grpc.insecure_channel(daemon.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "vtalloc.v1.Pages", "vtalloc.v1.Admin"):
            r = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=5)
        names = {s.name for a in answers for s in a.list_services_response.service}
    assert {"vtalloc.v1.Pages", "vtalloc.v1.Admin", "grpc.health.v1.Health"} <= names


def test_reflection_is_also_served_as_v1(daemon):
    """grpcurl and newer clients ask grpc.reflection.v1 first (grpcio-reflection ships v1alpha
    only; the daemon serves it under both names, and describes v1)."""
    from google.protobuf import descriptor_pb2

    with grpc.insecure_channel(daemon.address) as channel:
        info = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                     request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                     response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        asks = [reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="grpc.reflection.v1.ServerReflection"),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="vtalloc.v1.Pages")]
        listed, v1_file, pages_file = list(info(iter(asks), timeout=5))
    names = {s.name for s in listed.list_services_response.service}
    assert {"vtalloc.v1.Pages", "vtalloc.v1.Admin", "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"} <= names
    for answer, package in ((v1_file, "grpc.reflection.v1"), (pages_file, "vtalloc.v1")):
        assert answer.WhichOneof("message_response") == "file_descriptor_response", answer
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in answer.file_descriptor_response.file_descriptor_proto]
        assert package in {f.package for f in files}


def test_a_forked_child_cannot_use_its_parents_session(daemon):
    with ClientProc() as c:
        c.ok("open", address=daemon.address)
        c.ok("malloc", nbytes=PAGE, seed=4)
        r = c.ok("fork_try_lease")
        assert r["child_error"] == "ClosedError"
        assert c.ok("lease", pages=1)["leased"] == 1  # the parent's session still works


def test_ready_line_describes_the_daemon(daemon):
    r = daemon.ready
    assert r["event"] == "ready" and r["backend"] == "host" and r["page_bytes"] == PAGE
    assert r["control"] == daemon.address and r["capacity_bytes"] == 64 * MiB
    json.dumps(r)


def test_systemd_is_told_when_the_daemon_is_ready_and_stopping(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sink:
        sink.bind(path)
        sink.settimeout(10)
        d = Daemon(capacity="16MiB", env={"NOTIFY_SOCKET": path})
        with d:
            assert sink.recv(100) == b"READY=1"
            assert d.alive()
        assert sink.recv(100) == b"STOPPING=1"


def test_the_lease_grows_before_evictable_pages_are_evicted(daemon):
    """A shortage in a service-backed space is answered by leasing more while the node has
    pages; evictable pages go to host memory only when the lease cannot grow."""
    with ServiceAddressSpace(daemon.address, capacity=16 * MiB, lease_batch_pages=1, keep_free_pages=0) as space:
        first = space.malloc(4 * MiB)
        space.write(first, pattern(3, 4 * MiB))
        space.set_evictable(first)
        more = [space.malloc(4 * MiB) for _ in range(3)]  # the node has room: the lease grows
        assert space.stats().evictions == 0 and space.residency(first) == "resident"
        extra = space.malloc(4 * MiB)  # the lease is at its 16 MiB ceiling now: evict to serve it
        assert space.stats().evictions >= 1 and space.residency(first) == "evicted"
        assert space.read(first, 4 * MiB) == pattern(3, 4 * MiB)
        with pytest.raises(OutOfMemoryError):
            space.malloc(4 * MiB, evict=False)
        for a in [first, extra] + more:
            space.free(a)


def test_restoring_leases_pages_again_after_they_went_back(daemon):
    with ServiceAddressSpace(daemon.address, capacity=16 * MiB, lease_batch_pages=1, keep_free_pages=0) as space:
        a = space.malloc(4 * MiB)
        space.write(a, pattern(8, 4 * MiB))
        space.set_evictable(a)
        space.offload(a)
        space.synchronize()
        space.give_back(space.stats().pages_total)  # the freed device pages go back to the daemon
        assert space.stats().pages_total == 0 and space.residency(a) == "evicted"
        space.ensure_resident(a)  # needs two pages: leased again
        assert space.residency(a) == "resident" and space.stats().pages_total >= 2
        assert space.read(a, 4 * MiB) == pattern(8, 4 * MiB)
        space.free(a)


def test_a_call_the_channel_could_not_send_is_sent_again_while_the_daemon_lives(daemon, tmp_path):
    """Under load a connect can fail for a moment (a full accept queue); the daemon never saw the
    call, so the session sends it again, waiting for the channel, instead of failing the lease."""
    import threading

    import grpc

    from vtalloc.client.session import ServiceSession
    from vtalloc.server.proto.vtalloc.v1 import pages_pb2, pages_pb2_grpc
    from vtalloc.server.protocol.address import parse_address

    later = tmp_path / "later.sock"  # nothing listens here until the symlink to the daemon appears
    with ServiceSession(daemon.address, kind="observer", timeout_s=10.0) as session:
        channel = grpc.insecure_channel(f"unix://{later}", options=[("grpc.initial_reconnect_backoff_ms", 100),
                                                                    ("grpc.min_reconnect_backoff_ms", 100),
                                                                    ("grpc.max_reconnect_backoff_ms", 200)])
        try:
            stub = pages_pb2_grpc.PagesStub(channel)
            with pytest.raises(grpc.RpcError, match="failed to connect"):
                stub.GetStats(pages_pb2.GetStatsRequest(), timeout=5)  # what the session meets first
            timer = threading.Timer(0.5, lambda: later.symlink_to(parse_address(daemon.address)))
            timer.start()
            stats = session.call(stub, "GetStats", pages_pb2.GetStatsRequest())
            timer.join()
            assert stats.device.capacity_pages > 0
        finally:
            channel.close()
