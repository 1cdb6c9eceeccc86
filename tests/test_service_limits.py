"""The daemon under resource exhaustion and its operator limits (issue 11, finding 1 and
"limits"): a failing ``accept`` never ends the side channel, and each limit is a typed,
logged refusal while everyone else is served.

test_the_side_channel_survives_descriptor_exhaustion failed before its fix: the accept loop
ended on the first EMFILE and no session could open again.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys

import pytest
from helpers.service import Daemon, child_env, wait_until

from vtalloc.client.session import ServiceSession
from vtalloc.server.protocol.errors import ServiceUnavailableError
from vtalloc.server.side_channel import ACCEPT_BACKOFF_MAX_S, ACCEPT_LOG_EVERY_S, AcceptFailures


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def health(address: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "vtalloc.client.cli", "health", "--socket", address, "--json",
                          "--timeout", "2"], capture_output=True, text=True, timeout=30, env=child_env())
    return json.loads(out.stdout)


# -- finding 1: accept errors ----------------------------------------------------------------------
def test_the_side_channel_survives_descriptor_exhaustion():
    with Daemon(capacity="16MiB") as d:
        # A few descriptors of headroom: each session costs the daemon its socket and a pidfd.
        limit = open_fds(d.pid) + 8
        resource.prlimit(d.pid, resource.RLIMIT_NOFILE, (limit, limit))
        held: list[ServiceSession] = []
        try:
            with pytest.raises(ServiceUnavailableError):
                for _ in range(limit):
                    held.append(ServiceSession(d.address, kind="observer", timeout_s=1.0))
            assert 1 <= len(held) <= 8
        finally:
            for s in held:
                s.close()
        # Descriptors are free again: sessions open (the accept loop went on), health is fine.
        s = wait_until(lambda: _try_session(d.address), 10)
        s.close()
        assert health(d.address)["status"] == "SERVING"
        assert "accept failed: [Errno 24]" in d.log() and "accepting again" in d.log()
        assert d.alive()


def _try_session(address: str) -> ServiceSession | None:
    try:
        return ServiceSession(address, kind="observer", timeout_s=1.0)
    except ServiceUnavailableError:
        return None


def test_accept_failures_back_off_and_log_once_per_interval(caplog):
    now = [0.0]
    f = AcceptFailures(clock=lambda: now[0])
    emfile = OSError(errno.EMFILE, "Too many open files")
    waits = []
    with caplog.at_level("WARNING", logger="vtalloc.server"):
        for _ in range(200):
            waits.append(f.failed(emfile))
            now[0] += 0.1
        assert waits[0] < waits[1] < waits[2] and max(waits) == ACCEPT_BACKOFF_MAX_S
        lines = [r.getMessage() for r in caplog.records]
        # 200 failures over 19.9 s: the first, then one line per ACCEPT_LOG_EVERY_S (at 10 s); not 200.
        assert ACCEPT_LOG_EVERY_S == 10.0 and len(lines) == 2
        assert "RLIMIT_NOFILE" in lines[0]
        f.succeeded()
        assert "after 200 failed accepts" in caplog.records[-1].getMessage()
        assert f.count == 0 and f.total == 200
        assert f.failed(emfile) == waits[0]  # a new run starts from the shortest wait
