"""A restarted daemon knows what its predecessor's clients still hold (issue 11, finding 3).

Before the fix a daemon restarted after SIGKILL counted its whole capacity free: a new client
got 500 MiB while old clients held 400 MiB of a 512 MiB node. The daemon now keeps a state
file beside its socket (server/state_file.py) and a restarted daemon counts what live
processes of the previous instance hold as *inherited* until they exit.

Host backend, 8 MiB pages (64 of them: 512 MiB; memfd pages nobody writes cost no RAM).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.request

import pytest
from helpers.service import ClientProc, Daemon, Observer, short_dir, wait_until
from typer.testing import CliRunner

from vtalloc.client import ServiceAddressSpace
from vtalloc.client.cli import app
from vtalloc.server.state_file import STATE_FORMAT, Holder, StateFile, boot_id, process_start_ticks

MiB = 1 << 20
PAGE_MIB = 8
NODE = ("--page-size", f"{PAGE_MIB}MiB", "--default-quota", "0:1GiB")
RECLAIM_S = 1.0


def node(base) -> Daemon:
    return Daemon(base, capacity="512MiB", args=NODE)


def read_state(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def inherited(obs: Observer) -> tuple[int, int]:
    d = obs.stats().device
    return d.inherited_pages, d.free_pages


@pytest.fixture
def base():
    b = short_dir()
    yield b
    shutil.rmtree(b, ignore_errors=True)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_restarted_daemon_does_not_lease_what_old_clients_still_hold(base, how):
    d = node(base).start()
    try:
        with ClientProc() as a, ClientProc() as b, ClientProc() as c:
            for client in (a, b):
                client.ok("open", address=d.address, batch=1)
                assert client.ok("lease", pages=25)["leased"] == 25     # 200 MiB each: 400 of 512 MiB
            d.stop(getattr(signal, how))
            d = node(base).start()                                       # the same socket
            assert d.ready["inherited_bytes"] == 50 * PAGE_MIB * MiB
            c.ok("open", address=d.address, batch=1)
            r = c.call("lease", pages=500 // PAGE_MIB)                   # 500 MiB: more than is free
            assert not r["ok"] and r["error"] == "NodeShortError", r
            assert c.ok("lease", pages=14)["leased"] == 14               # 112 MiB: what is truly free
            assert c.call("lease", pages=1)["error"] == "NodeShortError"
            with Observer(d.address) as obs:
                s = obs.stats()
                assert (s.device.inherited_pages, s.device.inherited_processes) == (50, 2)
                assert (s.device.leased_pages, s.device.free_pages) == (14, 0)
                a.kill9()                                                # an old client goes: its 200 MiB come back
                t0 = time.monotonic()
                wait_until(lambda: inherited(obs) == (25, 25), 5, interval_s=0.005)
                assert time.monotonic() - t0 < RECLAIM_S
                assert c.ok("lease", pages=25)["leased"] == 25
                b.kill9()
                wait_until(lambda: inherited(obs) == (0, 25), 5, interval_s=0.005)
                assert obs.stats().counters.protocol_errors_total == 0
            assert "inherited" in d.log()
    finally:
        d.stop()


def test_the_state_file_follows_leases_and_returns(base):
    with node(base) as d, ClientProc() as a:
        path = d.socket + ".state"
        a.ok("open", address=d.address, batch=1, keep_free=0)
        a.ok("lease", pages=3)
        doc = read_state(path)
        assert doc["format"] == STATE_FORMAT and oct(os.stat(path).st_mode & 0o777) == "0o600"
        assert [(h["pid"], h["bytes"]) for h in doc["holders"]] == [(a.pid, 3 * PAGE_MIB * MiB)]
        assert doc["holders"][0]["start_ticks"] == process_start_ticks(a.pid)
        a.ok("give_back", pages=3)
        assert read_state(path)["holders"] == []


def test_a_second_restart_still_knows_the_first_daemons_clients(base):
    d = node(base).start()
    try:
        with ClientProc() as a:
            a.ok("open", address=d.address, batch=1)
            a.ok("lease", pages=10)
            d.kill9()
            d = node(base).start()
            d.kill9()                                                    # before anyone connected
            d = node(base).start()
            assert d.ready["inherited_bytes"] == 10 * PAGE_MIB * MiB
            a.kill9()
            with Observer(d.address) as obs:
                wait_until(lambda: inherited(obs) == (0, 64), 5)
    finally:
        d.stop()


def _write_state(d: Daemon, holders: list[dict], **fields) -> str:
    path = d.socket + ".state"
    os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    doc = {"format": STATE_FORMAT, "boot_id": boot_id(), "backend": "host", "device": 0, "holders": holders}
    doc.update(fields)
    with open(path, "w") as f:
        json.dump(doc, f)
    os.chmod(path, 0o600)
    return path


def test_only_the_same_live_process_is_counted(base):
    sleeper = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        ticks = process_start_ticks(sleeper.pid)
        d = node(base)
        _write_state(d, [
            {"pid": sleeper.pid, "start_ticks": ticks, "uid": 0, "bytes": 3 * PAGE_MIB * MiB},       # counted
            {"pid": sleeper.pid, "start_ticks": ticks, "uid": 0, "bytes": 1},                        # same: 1 page
            {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()) + 1, "uid": 0,
             "bytes": 9 * PAGE_MIB * MiB},                                                           # a reused pid
            {"pid": dead.pid, "start_ticks": 1, "uid": 0, "bytes": 9 * PAGE_MIB * MiB},              # gone
        ])
        with d, Observer(d.address) as obs:
            assert inherited(obs) == (4, 60)
            assert obs.stats().device.inherited_processes == 1
            sleeper.kill()
            sleeper.wait()
            wait_until(lambda: inherited(obs) == (0, 64), 5)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("damage", ["garbage", "wrong_format", "other_boot", "foreign_owner", "open_mode",
                                    "bad_entry"])
def test_a_damaged_or_untrusted_state_file_starts_the_daemon_with_nothing_inherited(base, damage):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        d = node(base)
        good = {"pid": sleeper.pid, "start_ticks": process_start_ticks(sleeper.pid), "uid": 0, "bytes": 8 * MiB}
        holders = [good]
        fields = {}
        if damage == "wrong_format":
            fields = {"format": "vtalloc.state/v0"}
        if damage == "other_boot":
            fields = {"boot_id": "00000000-0000-0000-0000-000000000000"}
        if damage == "bad_entry":
            holders = [good, {"pid": "x", "bytes": -1}, {"pid": 7, "start_ticks": 1, "uid": 0, "bytes": 2 ** 80}]
        path = _write_state(d, holders, **fields)
        if damage == "garbage":
            with open(path, "wb") as f:
                f.write(b"\x00{not json" * 100)
        if damage == "foreign_owner":
            os.chown(path, 65534, 65534)
        if damage == "open_mode":
            os.chmod(path, 0o666)
        with d, Observer(d.address) as obs:
            # A bad entry alone is dropped (the good one still counts); anything else about the
            # file makes it untrusted as a whole.
            assert inherited(obs) == ((1, 63) if damage == "bad_entry" else (0, 64))
            assert "state file" in d.log()
            doc = read_state(path)                        # replaced by a good one, 0600, ours
            assert doc["format"] == STATE_FORMAT
            st = os.stat(path)
            assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o600)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_state_file_round_trip_and_reasons(tmp_path, caplog):
    sf = StateFile(str(tmp_path / "x.state"))
    me = Holder(os.getpid(), process_start_ticks(os.getpid()), os.getuid(), 5 * MiB)
    sf.write("host", 0, [me])
    assert sf.write("host", 0, [me]) is False                           # unchanged: not written again
    with caplog.at_level(logging.WARNING, logger="vtalloc.server"):
        assert sf.load("host", 0) == [me]
        assert sf.load("cuda", 0) == []                                  # another device's pages
    assert "another device" in caplog.text
    assert StateFile(str(tmp_path / "none.state")).load("host", 0) == []


def test_a_client_of_the_old_daemon_keeps_working_while_counted(base):
    """The client library side: pages from before the restart are used and never returned."""
    d = node(base).start()
    try:
        space = ServiceAddressSpace(d.address, lease_batch_pages=1, keep_free_pages=64)
        try:
            space.lease(4)
            d.kill9()
            d = node(base).start()
            with Observer(d.address) as obs:
                assert inherited(obs) == (4, 60)
                assert space.lease(60) == 60                             # all that is free
                assert (obs.stats().device.leased_pages, inherited(obs)) == (60, (4, 0))
                assert space.stats().pages_total == 64                   # old pages still in use here
        finally:
            space.close()
        with Observer(d.address) as obs:
            wait_until(lambda: inherited(obs)[1] == 60, 5)               # its new pages came back
            assert inherited(obs)[0] == 4                                # the old ones: until it exits
    finally:
        d.stop()


def test_stats_cli_and_metrics_show_what_is_inherited(base):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        d = Daemon(base, capacity="512MiB", args=(*NODE, "--metrics-port", "0"))
        _write_state(d, [{"pid": sleeper.pid, "start_ticks": process_start_ticks(sleeper.pid), "uid": 0,
                          "bytes": 4 * PAGE_MIB * MiB}])
        with d:
            r = CliRunner().invoke(app, ["stats", "--json"], env={"VTALLOC_SOCKET": d.socket})
            assert r.exit_code == 0, r.stdout
            dev = json.loads(r.stdout)["devices"][0]
            assert (dev["inherited_pages"], dev["inherited_bytes"], dev["inherited_processes"]) == \
                (4, 4 * PAGE_MIB * MiB, 1)
            assert dev["free_pages"] == 60
            table = CliRunner().invoke(app, ["stats"], env={"VTALLOC_SOCKET": d.socket, "COLUMNS": "200"}).stdout
            assert "inherited" in table and "4 pg / 1 proc" in table
            text = urllib.request.urlopen(d.ready["metrics"], timeout=5).read().decode()
            assert 'vtalloc_pages{backend="host",device="0",state="inherited"} 4.0' in text
            assert 'vtalloc_pages{backend="host",device="0",state="free"} 60.0' in text
    finally:
        sleeper.kill()
        sleeper.wait()


def test_without_pidfd_an_inherited_exit_is_seen_by_polling_proc(tmp_path, monkeypatch):
    import asyncio

    from vtalloc.server.ledger import Ledger, NodeGeometry
    from vtalloc.server.state_keeper import POLL_S, StateKeeper

    def no_pidfd(pid):
        raise OSError(38, "pidfd_open: not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        ledger = Ledger(NodeGeometry("host", 0, MiB, 16, 0, 1.0))
        path = str(tmp_path / "x.state")
        StateFile(path).write("host", 0, [Holder(sleeper.pid, process_start_ticks(sleeper.pid), 0, 3 * MiB)])
        woken = []

        async def run() -> float:
            keeper = StateKeeper(path, ledger, lambda: woken.append(1))
            assert keeper.adopt() == 3 * MiB and ledger.books.free_pages() == 13
            sleeper.kill()
            sleeper.wait()
            t0 = time.monotonic()
            while ledger.books.free_pages() != 16 and time.monotonic() - t0 < 5:
                await asyncio.sleep(0.01)
            keeper.close()
            return time.monotonic() - t0

        assert asyncio.run(run()) < 2 * POLL_S + 0.5
        assert woken and read_state(path)["holders"] == []
    finally:
        sleeper.kill()
        sleeper.wait()


def _write_holders(path, holders: list[dict]) -> None:
    doc = {"format": STATE_FORMAT, "boot_id": boot_id(), "daemon_pid": 1, "backend": "host", "device": 0,
           "holders": holders}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)


def test_entries_for_one_pid_add_up_within_the_loaders_bounds(tmp_path, caplog):
    """Issue 23: two entries of 2**63-1 bytes for one pid were summed to 2**64-2 and written back
    out of the loader's own bounds (the next daemon then dropped the entry: nothing inherited)."""
    from vtalloc.server.inherited import Inherited
    from vtalloc.server.records import MAX_HOLDER_BYTES

    path = str(tmp_path / "x.state")
    me = {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid()), "uid": os.getuid()}
    other = dict(me, start_ticks=me["start_ticks"] + 1)
    _write_holders(path, [dict(me, bytes=MAX_HOLDER_BYTES), dict(me, bytes=MAX_HOLDER_BYTES),
                        dict(other, bytes=5)])
    sf = StateFile(path)
    with caplog.at_level(logging.ERROR, logger="vtalloc.server"):
        loaded = sf.load("host", 0)
    assert loaded == [Holder(**me, bytes=MAX_HOLDER_BYTES)]
    assert f"add up past {MAX_HOLDER_BYTES} bytes" in caplog.text
    assert "entry 2 dropped: pid" in caplog.text and "another start time" in caplog.text
    inherited = Inherited(PAGE_MIB * MiB)
    for h in loaded + loaded:          # a holder added twice still saturates
        inherited.add(h)
    written = inherited.holders([])
    assert written == [Holder(**me, bytes=MAX_HOLDER_BYTES)]
    sf.write("host", 0, written)
    assert max(h["bytes"] for h in read_state(path)["holders"]) <= MAX_HOLDER_BYTES
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="vtalloc.server"):
        assert StateFile(path).load("host", 0) == written     # loadable again, nothing dropped
    assert "dropped" not in caplog.text


@pytest.mark.parametrize("fail", ["write", "replace"])
def test_a_failed_state_file_write_leaves_no_temporary_file(tmp_path, monkeypatch, fail):
    import errno

    from vtalloc.server import state_file

    sf = StateFile(str(tmp_path / "x.state"))
    me = Holder(os.getpid(), process_start_ticks(os.getpid()), os.getuid(), 5 * MiB)

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_file.os, fail, no_space)
    with pytest.raises(OSError, match="No space"):
        sf.write("host", 0, [me])
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []
    assert sf.write("host", 0, [me]) is True        # not remembered as written
    assert sorted(os.listdir(tmp_path)) == ["x.state"]
