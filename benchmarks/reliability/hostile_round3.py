"""Issue 38's attack classes, as a campaign: each attempt must end refused (typed) or harmless.

Owns: four tallies, one per class of attack of round three:
- ``runtime_files``: time-of-check races and planted files in the runtime directory (the stats
  publisher writing through a link or a directory another user controls, ``vtalloc stats --pid``
  reading a link to /dev/zero, a FIFO, an oversized, forged, deep or foreign record; as root, another
  uid exchanging the victim's ``proc/`` while it publishes);
- ``retention``: descriptors kept past a Return, past the session's end and in a child that
  outlives the client (each page's memory must be gone: revoked), and the node's books after;
- ``connection_floods``: one uid's gRPC connections past its bound, descriptors sent on the gRPC
  socket, one peer's metrics connections past its bound (each must be closed at once), and a
  fresh client served after each flood;
- ``session_state``: hellos declaring quotas in a loop beside sessions that never watch (the
  daemon's memory must stay flat), reports and returns naming more pages than the session holds,
  principals with a trailing newline (each refused).
Typed outcome: the attempt was refused with the project's error, or did nothing (a file left as
it was, a connection closed, memory flat); anything else is "other".
Invariants: after each class the daemon still serves a fresh client; nothing is left leased.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import socket
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from reliability.common import Tally
from reliability.hostile_service import serves
from reliability.live import Daemon, Observer, wait_until
from vtalloc.allocator import AddressSpace, InvalidArgumentError
from vtalloc.allocator.publish import MAX_RECORD_BYTES, SCHEMA, publish_stats, read_published, unpublish_stats
from vtalloc.client.session import ServiceSession
from vtalloc.server.grpc_front import connections_per_uid
from vtalloc.server.metrics import METRICS_PER_PEER
from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2
from vtalloc.server.protocol.side_channel import PROTOCOL_VERSION, encode

PAGE = 2 << 20
OTHER_UID = 64999          # a uid with no account: another user, for the root-only attempts
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@contextlib.contextmanager
def runtime_env(path: Path):
    old = os.environ.get("VTALLOC_RUNTIME_DIR")
    os.environ["VTALLOC_RUNTIME_DIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("VTALLOC_RUNTIME_DIR", None)
        else:
            os.environ["VTALLOC_RUNTIME_DIR"] = old


def _publish_once(seconds: float = 0.15) -> None:
    with AddressSpace(backend="host", capacity=8 * PAGE) as space:
        publish_stats(space, interval_s=0.01)
        try:
            time.sleep(seconds)
        finally:
            unpublish_stats(space)


def _writer_case(t: Tally, base: Path, case: str) -> None:
    rt, elsewhere, target = base / "rt", base / "elsewhere", base / "target"
    elsewhere.mkdir(mode=0o700)
    target.write_text("keep")
    if case == "runtime is a link":
        rt.symlink_to(elsewhere)
    else:
        rt.mkdir(mode=0o700)
        if case == "runtime open to others":
            rt.chmod(0o777)
        elif case == "proc is a link":
            (rt / "proc").symlink_to(elsewhere)
        elif case == "proc open to others":
            (rt / "proc").mkdir()
            (rt / "proc").chmod(0o777)
        elif case == "planted tmp link":
            (rt / "proc").mkdir(mode=0o700)
            os.symlink(target, rt / "proc" / f"{os.getpid()}.tmp")
    with runtime_env(rt):
        _publish_once()
    if target.read_text() != "keep" or any(elsewhere.iterdir()):
        t.bad(f"publisher, {case}: wrote through it")
    elif case != "planted tmp link" and (rt / "proc").is_dir() and any((rt / "proc").iterdir()):
        t.bad(f"publisher, {case}: published into it")
    else:
        t.ok("refused or not followed")


def _reader_case(t: Tally, base: Path, case: str) -> None:
    proc = base / "rt" / "proc"
    proc.mkdir(parents=True, mode=0o700)
    path = proc / f"{os.getpid()}.json"
    record = {"schema": SCHEMA, "pid": os.getpid(), "uid": os.geteuid(), "updated_unix": time.time(),
              "interval_s": 1.0, "spaces": [{"name": "x", "backend": "host", "device": 0, "stats": {}}]}
    if case == "link to /dev/zero":
        os.symlink("/dev/zero", path)
    elif case == "fifo":
        os.mkfifo(path, 0o600)
    elif case == "oversized":
        path.write_text(" " * (MAX_RECORD_BYTES + 1))
    elif case == "escape sequences":
        record["spaces"][0]["name"] = "\x1b]2;owned\x07"
        path.write_text(json.dumps(record))
    elif case == "another pid":
        record["pid"] += 1
        path.write_text(json.dumps(record))
    elif case == "deep":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif case == "foreign directory":
        path.write_text(json.dumps(record))
        for p in (base / "rt", proc, path):
            os.chown(p, OTHER_UID, OTHER_UID)
    with runtime_env(base / "rt"):
        t.expect_error(f"stats --pid, {case}", lambda: read_published(os.getpid()), (InvalidArgumentError,))


def _exchange_race(t: Tally, base: Path, seconds: float) -> None:
    """As root: another uid made the runtime directory first and exchanges proc/ with its own,
    whose <pid>.tmp links to a file of ours, while we publish (the issue's attack)."""
    rt, target = base / f"vtalloc-{os.geteuid()}", base / "target"
    rt.mkdir(mode=0o777)
    os.chown(rt, OTHER_UID, OTHER_UID)
    os.chmod(rt, 0o777)
    target.write_text("keep")
    child = os.fork()
    if child == 0:  # the other user
        try:
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            libc = ctypes.CDLL(None, use_errno=True)
            proc, evil = str(rt / "proc").encode(), str(rt / "evil").encode()
            os.mkdir(evil)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                with contextlib.suppress(OSError):
                    os.symlink(str(target), os.path.join(evil, f"{os.getppid()}.tmp".encode()))
                if libc.renameat2(-100, proc, -100, evil, 2) == 0:
                    libc.renameat2(-100, proc, -100, evil, 2)
        finally:
            os._exit(0)
    try:
        with runtime_env(rt):
            _publish_once(seconds)
    finally:
        os.waitpid(child, 0)
    if target.read_text() == "keep":
        t.ok("not followed")
    else:
        t.bad("the other user's exchange made the publisher overwrite our file")


def runtime_files(rounds: int) -> Tally:
    t = Tally()
    for _ in range(rounds):
        for case in ("planted tmp link", "runtime open to others", "runtime is a link", "proc open to others",
                     "proc is a link"):
            base = Path(tempfile.mkdtemp(prefix="vtr3"))
            try:
                _writer_case(t, base, case)
            finally:
                shutil.rmtree(base, ignore_errors=True)
        cases = ["link to /dev/zero", "fifo", "oversized", "escape sequences", "another pid", "deep"]
        cases += ["foreign directory"] if os.geteuid() == 0 else []
        for case in cases:
            base = Path(tempfile.mkdtemp(prefix="vtr3"))
            try:
                _reader_case(t, base, case)
            finally:
                shutil.rmtree(base, ignore_errors=True)
    if os.geteuid() == 0:
        base = Path(tempfile.mkdtemp(prefix="vtr3"))
        os.chmod(base, 0o1777)
        try:
            _exchange_race(t, base, 1.0 + rounds)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    return t


def _lease_keeping(s: ServiceSession, pages: int) -> tuple[list[int], list[int]]:
    reply = s.call(s.pages, "Lease", pages_pb2.LeaseRequest(pages=pages), 10)
    fds: list[int] = []
    while len(fds) < pages:
        fds += s.recv_pages(5)[1]
    return list(reply.page_ids), fds


def _revoked(t: Tally, label: str, fds: list[int]) -> None:
    for fd in fds:
        if os.fstat(fd).st_size == 0 and os.pread(fd, 64, 0) == b"":
            t.ok("revoked")
        else:
            t.bad(f"{label}: a kept descriptor still reaches its page's memory")
        os.close(fd)


def retention(d: Daemon, obs: Observer, rounds: int) -> Tally:
    t = Tally()
    capacity = obs.stats().device.capacity_pages
    for r in range(rounds):
        with ServiceSession(d.address, timeout_s=10) as s:
            for _ in range(4):
                ids, fds = _lease_keeping(s, 3)
                s.call(s.pages, "Return", pages_pb2.ReturnRequest(page_ids=ids), 10)
                _revoked(t, f"round {r}, return", fds)
        s = ServiceSession(d.address, timeout_s=10)
        _, fds = _lease_keeping(s, 2)
        s.close()
        wait_until(lambda: obs.stats().device.free_pages == capacity, 10)
        _revoked(t, f"round {r}, session end", fds)
        free = obs.stats().device.free_pages
        (t.ok if free == capacity else t.bad)(f"round {r}: {free} of {capacity} free after the attempts")
        serves(t, d, f"retention round {r}")
    return t


def _closed_at_once(sock: socket.socket) -> bool:
    sock.settimeout(2)
    try:
        return sock.recv(1 << 16) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def connection_floods(rounds: int) -> Tally:
    t = Tally()
    sessions = 4
    bound = connections_per_uid(sessions)
    args = ("--max-sessions-per-uid", str(sessions), "--metrics-port", "0")
    with Daemon(capacity="16MiB", args=args) as d, ServiceSession(d.address, timeout_s=10) as me:
        me.call(me.pages, "GetSession", pages_pb2.GetSessionRequest(), 10)   # its channel is one of the bound
        for r in range(rounds):
            flood = []
            try:
                for _ in range(bound + 20):
                    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    flood.append(c)
                    c.connect(d.socket)
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        c.sendall(PREFACE)        # one over the bound may be closed before it is sent
                time.sleep(0.5)
                closed = sum(_closed_at_once(c) for c in flood[bound:])
                t.ok("closed at once") if closed == 20 else t.bad(f"round {r}: {20 - closed} connections over the bound held")
            finally:
                for c in flood:
                    c.close()
            time.sleep(0.3)                               # their slots come back once the daemon closed them
            serves(t, d, f"gRPC flood round {r}")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.connect(d.socket)
                devnull = os.open("/dev/null", os.O_RDONLY)
                try:
                    socket.send_fds(c, [PREFACE], [devnull, devnull])
                finally:
                    os.close(devnull)
                t.ok("closed") if _closed_at_once(c) else t.bad(f"round {r}: descriptors on the gRPC socket kept")
            host, port = d.ready["metrics"].split("//")[1].split("/")[0].rsplit(":", 1)
            metrics = [socket.create_connection((host, int(port)), timeout=2) for _ in range(METRICS_PER_PEER + 6)]
            try:
                time.sleep(0.3)
                closed = sum(_closed_at_once(c) for c in metrics[METRICS_PER_PEER:])
                t.ok("closed at once") if closed == 6 else t.bad(f"round {r}: {6 - closed} metrics connections over "
                                                                  "the per-peer bound held")
            finally:
                for c in metrics:
                    c.close()
            try:
                time.sleep(0.2)
                urllib.request.urlopen(d.ready["metrics"], timeout=5).read()
                t.ok("scraped")
            except OSError as e:
                t.bad(f"round {r}: a scrape after the flood failed: {e}")
    return t


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


def _under_asan(pid: int) -> bool:
    """The process runs with AddressSanitizer (.ci/sanitizers preloads it): its quarantine holds
    freed memory (256 MiB by default), so the process's RSS says nothing of what it keeps."""
    with open(f"/proc/{pid}/maps") as f:
        return any("libasan" in line for line in f)


def _declaring_hello(path: str, max_bytes: int) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.connect(path)
        s.send(encode({"t": "hello", "v": PROTOCOL_VERSION, "kind": "client", "quota": {"min": 0, "max": max_bytes}}))
        s.settimeout(5)
        s.recv(8192)
        s.send(encode({"t": "bye"}))


def session_state(d: Daemon, rounds: int) -> Tally:
    t = Tally()
    idle = [ServiceSession(d.address, timeout_s=10) for _ in range(40)]
    try:
        for i in range(100):
            _declaring_hello(d.ready["side_channel"], (64 << 20) + i)
        before = _rss(d.pid)
        for i in range(300 * rounds):              # paced: 100 a second (server/limits.py)
            _declaring_hello(d.ready["side_channel"], (64 << 20) + i)
        grown = _rss(d.pid) - before
        if _under_asan(d.pid):
            t.ok("hellos in a loop: the daemon's growth not measured under AddressSanitizer (its quarantine)")
        else:
            (t.ok if grown < 8 << 20 else t.bad)(f"hellos in a loop: the daemon grew by {grown >> 10} KiB")
    finally:
        for s in idle:
            s.close()
    with ServiceSession(d.address, timeout_s=30) as s:
        _, fds = _lease_keeping(s, 1)
        for fd in fds:
            os.close(fd)
        for _ in range(rounds):
            huge = pages_pb2.ClientReport(page_uses=[pages_pb2.PageUseReport(page_id=i) for i in range(600_000)])
            t.expect_error("a report of 600,000 page uses",
                           lambda huge=huge: s.call(s.pages, "Report", pages_pb2.ReportRequest(report=huge), 30))
            t.expect_error("a return of 65,536 ids",
                           lambda: s.call(s.pages, "Return", pages_pb2.ReturnRequest(page_ids=list(range(65536))), 30))
            for name in ("uid:1\n", "team\n", "pod:" + "0" * 32 + "\n"):
                t.expect_error(f"principal {name!r}", lambda name=name: s.call(
                    s.admin, "SetQuota", admin_pb2.SetQuotaRequest(principal=name, max_bytes=PAGE), 10))
    serves(t, d, "session state")
    return t


def run(scale: int, seed: int) -> dict[str, Any]:
    del seed  # the attempts are fixed: each is a case of its class
    out: dict[str, Any] = {"runtime_files": runtime_files(scale)}
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB")) as d, Observer(d.address) as obs:
        out["retention"] = retention(d, obs, scale)
        out["session_state"] = session_state(d, scale)
        wait_until(lambda: obs.stats().device.leased_pages == 0, 10)
        log = d.log()
    out["connection_floods"] = connection_floods(scale)
    if "Traceback" in log:
        out["session_state"].bad("the daemon logged a traceback: " + log[log.find("Traceback"):][:300])
    return out
