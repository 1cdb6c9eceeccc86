"""Hostile gRPC requests and side-channel messages against a live daemon.

Owns: the generators (garbage, truncated and oversized protobuf; missing or forged session
tokens; hostile field values; garbage, non-object, oversized and wrongly versioned JSON;
unknown message types; descriptors where none belong) and their tallies.
Typed outcome, gRPC: a status other than UNKNOWN/INTERNAL/DEADLINE_EXCEEDED with a message
(through ServiceSession: one of the project's errors). Side channel: the daemon drops that
connection (a protocol error that ends only that peer) or answers an error message.
Invariants: after every batch the daemon is alive and still serves a fresh client (a lease
of one page and its return); at the end no page is left leased.
"""

from __future__ import annotations

import json
import os
import random
import socket
from typing import Any

import grpc

from reliability.common import Tally
from reliability.live import Daemon, Observer, wait_until
from vtalloc.client.session import ServiceSession
from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2
from vtalloc.server.protocol.rpc import SESSION_KEY
from vtalloc.server.protocol.side_channel import MAX_MESSAGE_BYTES

UNTYPED = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED}
METHODS = [("vtalloc.v1.Pages", m) for m in ("GetSession", "Lease", "Return", "Report", "GetStats", "ListPages")] + \
          [("vtalloc.v1.Admin", m) for m in ("GetQuota", "SetQuota", "EvictSession")]
U64 = 2 ** 64


def serves(t: Tally, d: Daemon, label: str) -> None:
    """The daemon still serves a fresh client after a batch of hostile input."""
    if not d.alive():
        t.bad(f"{label}: the daemon died")
        return
    try:
        with ServiceSession(d.address, timeout_s=10) as s:
            reply = s.call(s.pages, "Lease", pages_pb2.LeaseRequest(pages=1), 10)
            _, fds = s.recv_pages(10)
            for fd in fds:
                os.close(fd)
            s.call(s.pages, "Return", pages_pb2.ReturnRequest(page_ids=list(reply.page_ids)), 10)
    except Exception as e:  # noqa: BLE001
        t.bad(f"{label}: a fresh client was not served: {type(e).__name__}: {e}")


def raw_call(t: Tally, channel: grpc.Channel, service: str, method: str, payload: bytes,
             metadata: tuple | None, label: str) -> None:
    fn = channel.unary_unary(f"/{service}/{method}", request_serializer=lambda b: b,
                             response_deserializer=lambda b: b)
    try:
        fn(payload, timeout=10, metadata=metadata)
    except grpc.RpcError as e:
        if e.code() in UNTYPED or not e.details():
            t.bad(f"{label}: {e.code()} {e.details()!r:.120}")
        else:
            t.ok(e.code().name)
        return
    t.bad(f"{label}: accepted")


def grpc_campaign(d: Daemon, rounds: int, seed: int) -> Tally:
    t = Tally()
    rng = random.Random(seed)
    good = pages_pb2.ReportRequest(report=pages_pb2.ClientReport(allocated_bytes=5, evictions_total=3)).SerializeToString()
    with ServiceSession(d.address, timeout_s=10) as me, \
            grpc.insecure_channel("unix:" + d.socket) as ch:
        token = ((SESSION_KEY, me._token),)
        for r in range(rounds):
            for service, method in METHODS:
                label = f"{service}/{method}"
                raw_call(t, ch, service, method, b"", None, f"{label} without a session")
                raw_call(t, ch, service, method, b"", ((SESSION_KEY, "forged" + str(rng.random())),), f"{label} forged token")
                raw_call(t, ch, service, method, b"", ((SESSION_KEY, "x" * 3000),), f"{label} huge token")
                for _ in range(3):
                    junk = rng.randbytes(rng.randint(1, 2048))
                    if method in ("GetSession", "GetStats", "ListPages", "GetQuota"):
                        junk = b"\xff" + junk  # an invalid tag: these requests parse anything else as empty
                    raw_call(t, ch, service, method, junk, token, f"{label} garbage")
                # a length-delimited field that claims more bytes than follow (a message cut short)
                raw_call(t, ch, service, method, b"\x0a" + bytes([rng.randint(8, 120)]) + good[:rng.randint(0, 6)], token,
                         f"{label} truncated")
                raw_call(t, ch, service, method, b"\x0a" + b"\xff" * 10 + b"\x01" + rng.randbytes(64), token,
                         f"{label} bad varint")
            raw_call(t, ch, "vtalloc.v1.Pages", "Report", b"\x0a\x80\x80\x80\x40" + b"\x00" * 100, token, "oversized length")
            raw_call(t, ch, "vtalloc.v1.Pages", "Report", rng.randbytes(8 << 20), token, "8 MiB message")
            raw_call(t, ch, "vtalloc.v2.Pages", "Lease", b"", token, "unknown service version")
            raw_call(t, ch, "vtalloc.v1.Pages", "Nope", b"", token, "unknown method")
            for request, what in (
                    (("Lease", pages_pb2.LeaseRequest(pages=0)), "lease 0"),
                    (("Lease", pages_pb2.LeaseRequest(pages=2 ** 32 - 1)), "lease 2^32-1"),
                    (("Lease", pages_pb2.LeaseRequest(pages=rng.randint(10 ** 6, 2 ** 32 - 1))), "lease huge"),
                    (("Return", pages_pb2.ReturnRequest(page_ids=[rng.getrandbits(64) for _ in range(5)])), "return foreign"),
                    (("Return", pages_pb2.ReturnRequest(page_ids=[1] * 100000)), "return repeated"),
                    (("Report", pages_pb2.ReportRequest(report=pages_pb2.ClientReport(evicted_bytes=U64 - 1))), "report 2^64-1"),
                    (("GetStats", pages_pb2.GetStatsRequest(session_id="s" * 100000)), "stats of a huge id"),
                    (("ListPages", pages_pb2.ListPagesRequest(session_id=str(rng.random()))), "pages of no session")):
                t.expect_error(what, lambda: me.call(me.pages, request[0], request[1], 10))
            for request, what in ((admin_pb2.SetQuotaRequest(principal="", max_bytes=1), "quota of no one"),
                                  (admin_pb2.SetQuotaRequest(principal="\x00" * 5000, max_bytes=U64 - 1), "quota nul"),
                                  (admin_pb2.EvictSessionRequest(session_id="nope"), "evict no session")):
                t.expect_error(what, lambda: me.call(me.admin, type(request).__name__.replace("Request", ""), request, 10))
            serves(t, d, f"grpc round {r}")
    return t


def side_answer(path: str, datagrams: list[bytes], fds: list[int] = ()) -> bytes | None:
    """Send the datagrams on a fresh side-channel connection; what the daemon answers last
    (b"" when it dropped the connection), None when it kept the connection open and silent."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sk:
        sk.settimeout(5)
        sk.connect(path)
        answer = None
        for i, data in enumerate(datagrams):
            try:
                if fds and i == len(datagrams) - 1:
                    sk.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(
                        (ctypes_fd_array(fds)))))])
                else:
                    sk.send(data)
            except (BrokenPipeError, ConnectionResetError):
                return b""
            try:
                answer = sk.recv(MAX_MESSAGE_BYTES)
            except TimeoutError:
                return None
            except ConnectionResetError:
                return b""
        return answer


def ctypes_fd_array(fds: list[int]) -> bytes:
    import array

    return array.array("i", fds).tobytes()


HELLO = {"t": "hello", "v": 1, "kind": "observer"}


def hostile_datagrams(rng: random.Random) -> list[tuple[str, list[bytes], bool]]:
    """(label, datagrams, with descriptors) - each must end in a drop or an error answer."""
    j = lambda m: json.dumps(m).encode()  # noqa: E731
    hello = j(HELLO)
    out = [("empty", [b""], False), ("garbage", [rng.randbytes(rng.randint(1, 4000))], False),
           ("not json", [b"hello?"], False), ("json array", [b"[1,2]"], False), ("json string", [b'"hello"'], False),
           ("no type", [j({"v": 1, "kind": "client"})], False), ("unknown type", [j({"t": "gimme", "v": 1})], False),
           ("bye first", [j({"t": "bye"})], False), ("truncated hello", [hello[: rng.randint(1, len(hello) - 1)]], False),
           ("oversized", [b" " * (MAX_MESSAGE_BYTES + 1) + hello], False),
           ("nested", [b'{"t":"hello","v":1,"kind":"client","x":' + b"[" * 3000 + b"]" * 3000 + b"}"], False),
           ("hello with descriptors", [hello], True), ("utf-8 garbage", [b'{"t":"hello","v":1,"kind":"\xff\xfe"}'], False),
           ("hello twice", [hello, hello], False), ("garbage after hello", [hello, rng.randbytes(100)], False),
           ("unknown kind", [j({"t": "hello", "v": 1, "kind": "root"})], False),
           ("huge number", [b'{"t":"hello","v":1' + b"0" * 5000 + b',"kind":"client"}'], False)]
    for v in (0, 2, -1, "1", True, 1.5, None, 2 ** 64, [1]):
        out.append((f"version {v!r}", [j({"t": "hello", "v": v, "kind": "client"})], False))
    return out


def side_campaign(d: Daemon, rounds: int, seed: int) -> Tally:
    t = Tally()
    rng = random.Random(seed)
    path = d.ready["side_channel"]
    devnull = os.open("/dev/null", os.O_RDONLY)
    try:
        for r in range(rounds):
            for label, datagrams, with_fds in hostile_datagrams(rng):
                try:
                    got = side_answer(path, datagrams, [devnull, devnull] if with_fds else [])
                except Exception as e:  # noqa: BLE001
                    t.bad(f"{label}: {type(e).__name__}: {e}")
                    continue
                if got == b"":
                    t.ok("dropped")
                elif got is None:
                    t.bad(f"{label}: the daemon kept the connection open and said nothing (a hang)")
                else:
                    try:
                        kind = json.loads(got).get("t")
                    except ValueError:
                        kind = None
                    if kind == "error":
                        t.ok("error answer")
                    else:
                        t.bad(f"{label}: answered {got[:100]!r}")
            serves(t, d, f"side channel round {r}")
    finally:
        os.close(devnull)
    return t


def run(scale: int, seed: int) -> dict[str, Any]:
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB")) as d, Observer(d.address) as obs:
        g = grpc_campaign(d, scale, seed)
        s = side_campaign(d, 4 * scale, seed + 1)
        wait_until(lambda: obs.stats().device.leased_pages == 0, 10)
        errors = obs.stats().counters.protocol_errors_total
        log = d.log()
    if "Traceback" in log or "never retrieved" in log:
        s.bad("the daemon logged a traceback: " + log[log.find("Traceback"):][:300])
    return {"grpc": g, "side_channel": s, "daemon_protocol_errors_counted": errors}
