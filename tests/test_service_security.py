"""Security and robustness: who reaches the daemon, whose pages are whose, and bad input of every kind.

Other-uid clients are child processes that drop to ``nobody`` (root only). Malformed and
fuzzed requests (hypothesis) go to a live daemon, which must answer each with a status code
and keep serving: a real client leases and returns pages after the barrage.
"""

from __future__ import annotations

import array
import os
import socket
import stat
import subprocess
import sys

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers.service import NOBODY, NOGROUP, ClientProc, Daemon, Observer, child_env, short_dir
from helpers.spaces import MiB, PAGE

from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2
from vtalloc.server.protocol.rpc import SESSION_KEY
from vtalloc.server.protocol.side_channel import MAX_MESSAGE_BYTES

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="clients of other uids need root to start")

PAGES_METHODS = ("GetSession", "Lease", "Return", "Report", "Watch", "GetStats", "ListPages")
ADMIN_METHODS = ("GetQuota", "SetQuota", "EvictSession")


@pytest.fixture(scope="module")
def daemon():
    with Daemon(capacity="32MiB", args=("--group", "nogroup")) as d:
        yield d


def code_of(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def raw_call(channel: grpc.Channel, method: str, payload: bytes, token: str | None, timeout: float = 3.0):
    """Send raw bytes to a method, bypassing the stubs' serialization."""
    md = ((SESSION_KEY, token),) if token is not None else ()
    service = "vtalloc.v1.Admin" if method in ADMIN_METHODS else "vtalloc.v1.Pages"
    if method == "Watch":
        call = channel.unary_stream(f"/{service}/{method}")(payload, timeout=timeout, metadata=md)
        return list(call)
    return channel.unary_unary(f"/{service}/{method}")(payload, timeout=timeout, metadata=md)


def assert_daemon_serves(d: Daemon) -> None:
    """The daemon is up and still leases, delivers and takes back pages."""
    assert d.alive(), d.log()
    with ClientProc() as c:
        c.ok("open", address=d.address, batch=1)
        addr = c.ok("malloc", nbytes=PAGE, seed=9)["addr"]
        assert c.ok("check", addr=addr, nbytes=PAGE, seed=9)["intact"]
        c.ok("close")


def test_socket_directory_and_files_are_closed_to_others(daemon):
    d = os.stat(os.path.dirname(daemon.socket))
    assert stat.S_IMODE(d.st_mode) == 0o750 and d.st_uid == os.geteuid() and d.st_gid == NOGROUP
    for path in (daemon.socket, daemon.ready["side_channel"]):
        st_ = os.stat(path)
        assert stat.S_ISSOCK(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o660 and st_.st_gid == NOGROUP


@needs_root
def test_a_uid_outside_the_group_cannot_reach_the_daemon():
    # No --group: the directory is root:root 0750, and nobody is in neither.
    with Daemon(capacity="16MiB") as d, ClientProc(user=NOBODY, group=NOGROUP) as c:
        r = c.call("raw_open", address=d.address)
        assert not r["ok"] and r["error"] == "PermissionDeniedError" and "PermissionError" in r["bases"]


@needs_root
def test_another_uid_cannot_touch_a_sessions_pages_stats_or_admin_calls(daemon):
    with ClientProc() as owner, ClientProc(user=NOBODY, group=NOGROUP) as other:
        sid = owner.ok("raw_open", address=daemon.address)["session_id"]
        pages = owner.ok("raw_lease", pages=2)["page_ids"]
        assert other.ok("raw_open", address=daemon.address)["uid"] == NOBODY

        def rpc(method, request_type, request, service="pages"):
            return other.call("rpc", service=service, method=method, request_type=request_type, request=request)

        r = rpc("Return", "ReturnRequest", {"page_ids": pages})
        assert r["error"] == "PermissionDeniedError"
        r = rpc("GetStats", "GetStatsRequest", {"session_id": sid})
        assert r["error"] == "PermissionDeniedError"
        r = rpc("ListPages", "ListPagesRequest", {"session_id": sid})
        assert r["error"] == "PermissionDeniedError"
        stats = rpc("GetStats", "GetStatsRequest", {})["reply"]
        assert sid not in [s["info"]["session_id"] for s in stats.get("sessions", [])]
        assert stats["hidden_sessions"] >= 1 and not stats.get("admin_view", False)
        assert rpc("ListPages", "ListPagesRequest", {})["reply"]["hidden_pages"] >= 2
        r = rpc("SetQuota", "SetQuotaRequest", {"principal": f"uid:{NOBODY}", "min_bytes": 0,
                                                "max_bytes": 1 << 40}, "admin")
        assert r["error"] == "PermissionDeniedError"
        r = rpc("EvictSession", "EvictSessionRequest", {"session_id": sid, "pages": 1}, "admin")
        assert r["error"] == "PermissionDeniedError"
        r = rpc("GetQuota", "GetQuotaRequest", {"principal": "uid:0"}, "admin")
        assert r["error"] == "PermissionDeniedError"
        own = rpc("GetQuota", "GetQuotaRequest", {}, "admin")["reply"]["quotas"][0]
        assert own["principal"] == f"uid:{NOBODY}"
        # The owner's pages are still the owner's.
        with Observer(daemon.address) as obs:
            assert next(s for s in obs.stats().sessions if s.info.session_id == sid).info.leased_pages == 2


def test_a_directory_open_to_everyone_is_refused():
    base = short_dir()  # 0755: others may traverse it
    try:
        r = subprocess.run([sys.executable, "-m", "vtalloc.client.cli", "serve", "--backend", "host",
                            "--socket", str(base / "vtalloc.sock")], capture_output=True, text=True, timeout=60,
                           env=child_env())
        assert r.returncode == 1 and "open to every user" in r.stderr
    finally:
        os.rmdir(base)


def test_a_second_daemon_on_the_same_socket_is_refused(daemon):
    r = subprocess.run([sys.executable, "-m", "vtalloc.client.cli", "serve", "--backend", "host",
                        "--socket", daemon.socket], capture_output=True, text=True, timeout=60, env=child_env())
    assert r.returncode == 1 and "already serves" in r.stderr
    assert daemon.alive()


def test_bad_requests_get_their_status_codes_and_change_nothing(daemon):
    with Observer(daemon.address) as obs, ClientProc() as c:
        s = obs.session
        c.ok("raw_open", address=daemon.address)
        ids = c.ok("raw_lease", pages=2)["page_ids"]
        leased = obs.stats().device.leased_pages

        def rpc(method, request_type, request, service="pages"):
            r = c.call("rpc", service=service, method=method, request_type=request_type, request=request)
            return r.get("error", "ok")

        assert rpc("Lease", "LeaseRequest", {"pages": 0}) == "InvalidArgumentError"
        assert rpc("Lease", "LeaseRequest", {"pages": 100000}) == "InvalidArgumentError"
        assert rpc("Return", "ReturnRequest", {"page_ids": [10 ** 12]}) == "NotFoundError"
        assert rpc("Return", "ReturnRequest", {"page_ids": [ids[0], ids[0]]}) == "InvalidArgumentError"
        assert rpc("Return", "ReturnRequest", {"page_ids": [ids[0]], "evict_request_id": 99}) == "NotFoundError"
        assert rpc("GetStats", "GetStatsRequest", {"session_id": "nope"}) == "NotFoundError"
        assert rpc("SetQuota", "SetQuotaRequest", {"principal": "no spaces allowed", "max_bytes": 1},
                   "admin") == "InvalidArgumentError"
        assert rpc("SetQuota", "SetQuotaRequest", {"principal": "team", "min_bytes": 2, "max_bytes": 1},
                   "admin") == "InvalidArgumentError"
        assert rpc("EvictSession", "EvictSessionRequest", {"session_id": "nope"}, "admin") == "NotFoundError"
        assert obs.stats().device.leased_pages == leased
        # An observer session may read but not lease or watch.
        assert code_of(lambda: s.pages.Lease(pages_pb2.LeaseRequest(pages=1), timeout=3,
                                             metadata=((SESSION_KEY, s._token),))) == grpc.StatusCode.FAILED_PRECONDITION
        with grpc.insecure_channel(daemon.address) as ch:
            for token in (None, "", "0" * 32):
                assert code_of(lambda: raw_call(ch, "GetStats", b"", token)) == grpc.StatusCode.UNAUTHENTICATED
            assert code_of(lambda: raw_call(ch, "Lease", b"\xff\xff\xff", s._token)) == grpc.StatusCode.INVALID_ARGUMENT
            big = pages_pb2.ReturnRequest(page_ids=range(1 << 50, (1 << 50) + 700_000)).SerializeToString()
            assert len(big) > 4 << 20
            assert code_of(lambda: raw_call(ch, "Return", big, s._token)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_daemon_serves(daemon)


def test_bad_side_channel_peers_are_dropped_and_counted(daemon):
    path = daemon.ready["side_channel"]
    with Observer(daemon.address) as obs:
        before = obs.stats().counters.protocol_errors_total
        junk = [b"\x00", b"not json", b'{"t":"hello","v":99,"kind":"client"}', b'{"t":"hello","v":1,"kind":"root"}',
                b'{"t":"bye"}', b"x" * (MAX_MESSAGE_BYTES + 10)]
        for data in junk:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sk:
                sk.connect(path)
                sk.send(data)
                sk.settimeout(5)
                assert sk.recv(100) == b""  # dropped, no session
        # Descriptors sent to the daemon are refused too (it never accepts any).
        r, w = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sk:
            sk.connect(path)
            sk.sendmsg([b'{"t":"hello","v":1,"kind":"client"}'],
                       [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))])
            sk.settimeout(5)
            assert sk.recv(100) == b""
        os.close(r)
        os.close(w)
        # A connection that never says hello is dropped after a while, and blocks nobody meanwhile.
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
            silent.connect(path)
            assert obs.stats().device.capacity_pages > 0
            silent.settimeout(10)
            assert silent.recv(100) == b""
        assert obs.stats().counters.protocol_errors_total == before + len(junk) + 2
    assert_daemon_serves(daemon)


_messages = st.sampled_from(PAGES_METHODS + ADMIN_METHODS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=_messages, payload=st.binary(max_size=256), with_token=st.booleans())
def test_fuzzed_bytes_never_crash_the_daemon(daemon, fuzz_channel, method, payload, with_token):
    channel, token = fuzz_channel
    code = code_of(lambda: raw_call(channel, method, payload, token if with_token else None, timeout=5))
    assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE), \
        (method, payload, code, daemon.log()[-2000:])


_fields = st.one_of(st.integers(0, 2 ** 64 - 1), st.integers(0, 16))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pages=_fields, ids=st.lists(_fields, max_size=8), evict_id=_fields, session=st.text(max_size=20),
       principal=st.text(max_size=70), lo=_fields, hi=_fields)
def test_fuzzed_fields_get_typed_answers(daemon, fuzz_channel, pages, ids, evict_id, session, principal, lo, hi):
    channel, token = fuzz_channel
    md = ((SESSION_KEY, token),)
    from vtalloc.server.proto.vtalloc.v1 import admin_pb2_grpc, pages_pb2_grpc

    p, a = pages_pb2_grpc.PagesStub(channel), admin_pb2_grpc.AdminStub(channel)
    calls = [
        lambda: p.Lease(pages_pb2.LeaseRequest(pages=pages % (1 << 32)), timeout=5, metadata=md),
        lambda: p.Return(pages_pb2.ReturnRequest(page_ids=ids, evict_request_id=evict_id), timeout=5, metadata=md),
        lambda: p.GetStats(pages_pb2.GetStatsRequest(session_id=session), timeout=5, metadata=md),
        lambda: p.ListPages(pages_pb2.ListPagesRequest(session_id=session), timeout=5, metadata=md),
        lambda: a.GetQuota(admin_pb2.GetQuotaRequest(principal=principal), timeout=5, metadata=md),
        lambda: a.EvictSession(admin_pb2.EvictSessionRequest(session_id=session, pages=pages % 64), timeout=5,
                               metadata=md),
    ]
    for call in calls:
        code = code_of(call)
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                        grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.RESOURCE_EXHAUSTED), (code, daemon.log()[-2000:])


@pytest.fixture(scope="module")
def fuzz_channel(daemon):
    """An observer session's token and a channel, for the fuzzers (quotas are not set: admin would)."""
    with Observer(daemon.address) as obs, grpc.insecure_channel(daemon.address) as ch:
        yield ch, obs.session._token


def test_the_daemon_serves_after_the_fuzzers(daemon):
    assert_daemon_serves(daemon)
    assert "Traceback" not in daemon.log()
