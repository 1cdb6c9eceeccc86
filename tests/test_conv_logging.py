"""Logging: one `vtalloc` logger hierarchy with only a NullHandler from the library; quota
changes, refusals and forced evictions leave a line on the daemon's side."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest
from helpers.service import Daemon
from helpers.sizes import PAGE
from typer.testing import CliRunner

from vtalloc.client.cli import app
from vtalloc.client.service_space import ServiceAddressSpace
from vtalloc.server.errors import QuotaExceededError
from vtalloc.server.ledger import Ledger, NodeGeometry
from vtalloc.server.quota import Quota


def test_the_library_adds_only_a_null_handler_under_vtalloc():
    code = ("import logging, vtalloc.allocator, vtalloc.allocator.torch, vtalloc.server.node, vtalloc.client.lease\n"
            "names = [n for n in logging.root.manager.loggerDict if n == 'vtalloc' or n.startswith('vtalloc.')]\n"
            "handlers = {n: [type(h).__name__ for h in logging.getLogger(n).handlers] for n in names}\n"
            "print(json.dumps({'handlers': handlers, 'root': len(logging.root.handlers)}))\n")
    out = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["root"] == 0  # nothing configured for the application
    assert got["handlers"].pop("vtalloc") == ["NullHandler"]
    assert {"vtalloc.allocator", "vtalloc.server", "vtalloc.client"} <= set(got["handlers"])
    assert all(h == [] for h in got["handlers"].values())


def test_quota_changes_and_refusals_are_logged(caplog):
    caplog.set_level(logging.INFO, logger="vtalloc")
    ledger = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0), quotas=[Quota("uid:1000", 0, 4 * PAGE)])
    ledger.quotas.set("uid:1000", PAGE, 2 * PAGE)
    s = ledger.sessions.open(10, 1000, 1000, "client")
    with pytest.raises(QuotaExceededError):
        ledger.leases.admit(s, 3)
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert ("vtalloc.server", "INFO", f"quota of uid:1000 set: min {PAGE} bytes, max {2 * PAGE} bytes "
            f"(was min 0, max {4 * PAGE})") in lines
    assert any(name == "vtalloc.server" and "lease of 3 pages" in m and "refused" in m and "uid:1000" in m
               for name, _, m in lines)


def test_a_forced_eviction_leaves_lines_in_the_daemon_log():
    with Daemon(capacity="64MiB", args=("--log-level", "info")) as d, \
            ServiceAddressSpace(d.address, lease_batch_pages=1, keep_free_pages=0) as space:
        addr = space.malloc(2 * PAGE)
        r = CliRunner().invoke(app, ["evict", space.session.session_id, "--pages", "1", "--json"],
                               env={"VTALLOC_SOCKET": d.socket})
        assert r.exit_code == 0, r.stdout
        deadline = time.monotonic() + 10
        while "forced eviction of session" not in d.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        log, sid = d.log(), space.session.session_id
        space.free(addr)
    assert "forced eviction by uid" in log and f"session {sid}" in log
    assert "asked for 1 of its" in log and "pages given back" in log
