"""Issue 23, round two: the metrics port is reachable by every local user, so what it can make
the daemon hold is bounded (server/metrics.py): at most METRICS_MAX_CONNECTIONS connections,
idle ones closed after METRICS_IDLE_TIMEOUT_S, none held past METRICS_REQUEST_DEADLINE_S."""

from __future__ import annotations

import os
import socket
import time
import urllib.parse
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers.service import Daemon, wait_until

from vtalloc.server.metrics import METRICS_IDLE_TIMEOUT_S, METRICS_MAX_CONNECTIONS, METRICS_REQUEST_DEADLINE_S

IDLE_CONNECTIONS = 300


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def health_ok(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
    return r.status == health_pb2.HealthCheckResponse.SERVING


def closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_idle_metrics_connections_are_bounded_and_timed_out():
    with Daemon(capacity="16MiB", args=("--metrics-port", "0")) as d:
        url = urllib.parse.urlparse(d.ready["metrics"])
        urllib.request.urlopen(d.ready["metrics"], timeout=5).read()
        before = open_fds(d.pid)
        idle = []
        try:
            t0 = time.monotonic()
            for _ in range(IDLE_CONNECTIONS):
                idle.append(socket.create_connection((url.hostname, url.port), timeout=5))
            time.sleep(0.5)
            held = open_fds(d.pid) - before
            assert held <= METRICS_MAX_CONNECTIONS + 4, held   # was one per connection, no limit
            assert health_ok(d.address)
            # Those over the bound were closed at once; the rest after the idle timeout.
            assert sum(closed_by_peer(s) for s in idle) >= IDLE_CONNECTIONS - METRICS_MAX_CONNECTIONS
            wait_until(lambda: all(closed_by_peer(s) for s in idle), METRICS_IDLE_TIMEOUT_S + 5)
            assert time.monotonic() - t0 >= METRICS_IDLE_TIMEOUT_S * 0.9
            wait_until(lambda: open_fds(d.pid) <= before, 5)
            assert b"vtalloc_build_info" in urllib.request.urlopen(d.ready["metrics"], timeout=5).read()
            assert "connections open, the limit" in d.log() and "Traceback" not in d.log()
        finally:
            for s in idle:
                s.close()


def test_a_slow_sender_is_cut_off_at_the_deadline():
    with Daemon(capacity="16MiB", args=("--metrics-port", "0")) as d:
        url = urllib.parse.urlparse(d.ready["metrics"])
        with socket.create_connection((url.hostname, url.port), timeout=5) as s:
            t0 = time.monotonic()
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            closed = False
            while time.monotonic() - t0 < METRICS_REQUEST_DEADLINE_S + 5:
                try:
                    s.sendall(b"X-Slow: 1\r\n")   # within the idle timeout, forever
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                if closed_by_peer(s):
                    closed = True
                    break
                s.settimeout(5)
                time.sleep(METRICS_IDLE_TIMEOUT_S / 3)
            took = time.monotonic() - t0
            assert closed and METRICS_REQUEST_DEADLINE_S * 0.9 <= took < METRICS_REQUEST_DEADLINE_S + 3, took
        assert health_ok(d.address)
