"""Crash reclaim and daemon restarts, with real processes and SIGKILL.

A client killed at any point of a lease loses its pages to the daemon within one second of
being gone (measured from the moment the test reaps it), and the reclaim is counted. A
daemon killed or stopped leaves running clients working with what they have mapped; new
requests fail at once with ServiceUnavailableError, and work again once it is back.
The eviction engine is not in this branch, so "during restore" is the client's own lease
in flight (a restore needs a page like any other); "during eviction" is a client killed
inside its eviction handler.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
from helpers.service import ClientProc, Daemon, Observer, short_dir, wait_until
from helpers.spaces import MiB, PAGE, pattern

from vtalloc.client import ServiceAddressSpace
from vtalloc.server.errors import ServiceUnavailableError

RECLAIM_S = 1.0


@pytest.fixture
def daemon():
    # Max above capacity: sessions of one uid may press on each other (nobody's quota stops them).
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB"), evict_deadline=2.0) as d:
        yield d


def reclaimed_after(obs: Observer, session_id: str, leased_before_others: int, dead_at: float) -> float:
    """Seconds from ``dead_at`` until the session is gone and its pages are back."""
    def gone():
        s = obs.stats()
        ids = {x.info.session_id for x in s.sessions}
        return session_id not in ids and s.device.leased_pages + s.device.delivering_pages == leased_before_others
    wait_until(gone, 5, interval_s=0.005)
    return time.monotonic() - dead_at


def test_killed_before_the_descriptors_arrive(daemon):
    with Observer(daemon.address) as obs, ClientProc() as c:
        sid = c.ok("raw_open", address=daemon.address)["session_id"]
        assert len(c.ok("raw_lease", pages=3)["page_ids"]) == 3  # descriptors left unread in its socket
        assert obs.stats().device.leased_pages == 3
        before = obs.stats().counters
        dead_at = c.kill9()
        assert reclaimed_after(obs, sid, 0, dead_at) < RECLAIM_S
        after = obs.stats().counters
        assert after.reclaims_total == before.reclaims_total + 1
        assert after.reclaimed_pages_total == before.reclaimed_pages_total + 3


def test_killed_while_its_pages_are_mapped(daemon):
    with Observer(daemon.address) as obs, ClientProc() as c:
        sid = c.ok("open", address=daemon.address)["session_id"]
        c.ok("malloc", nbytes=4 * PAGE, seed=1)
        wait_until(lambda: obs.stats().device.leased_pages >= 4, 5)
        dead_at = c.kill9()
        assert reclaimed_after(obs, sid, 0, dead_at) < RECLAIM_S
        assert obs.stats().device.free_pages == 16


def test_killed_during_eviction_its_pages_serve_the_waiting_lease(daemon, tmp_path):
    marker = tmp_path / "evicting"
    with Observer(daemon.address) as obs, ClientProc() as a, ClientProc() as b:
        sa = a.ok("open", address=daemon.address, batch=1, evict="slow", sleep=30, marker=str(marker))["session_id"]
        a.ok("malloc", nbytes=14 * PAGE, seed=1)
        b.ok("open", address=daemon.address, batch=1)
        b.send("malloc", nbytes=4 * PAGE, seed=2)  # the node is 2 pages short: A is asked to evict
        wait_until(marker.exists, 5)
        dead_at = a.kill9()
        assert reclaimed_after(obs, sa, 4, dead_at) < RECLAIM_S  # 4: what B leased since
        r = b.recv()
        assert r["ok"], r
        assert b.ok("check", addr=r["addr"], nbytes=4 * PAGE, seed=2)["intact"]
        assert obs.stats().counters.reclaims_total >= 1


def test_killed_while_its_own_lease_waits_nothing_leaks(daemon, tmp_path):
    with Observer(daemon.address) as obs, ClientProc() as a, ClientProc() as b:
        a.ok("open", address=daemon.address, batch=1, evict="refuse")
        held = a.ok("malloc", nbytes=16 * PAGE, seed=1)["addr"]  # the whole node
        sb = b.ok("open", address=daemon.address, batch=1)["session_id"]
        b.send("malloc", nbytes=2 * PAGE, seed=2)     # waits for A, which will not evict
        wait_until(lambda: obs.stats().counters.evict_requests_total >= 1, 5)
        dead_at = b.kill9()
        assert reclaimed_after(obs, sb, 16, dead_at) < RECLAIM_S
        time.sleep(daemon.evict_deadline + 0.5)       # the abandoned lease gives up: nothing created
        s = obs.stats()
        assert s.device.leased_pages == 16 and s.device.delivering_pages == 0
        assert a.ok("check", addr=held, nbytes=16 * PAGE, seed=1)["intact"]


def test_a_forked_holder_of_the_socket_does_not_delay_reclaim(daemon):
    """EOF never comes while another process holds the socket; the pidfd still tells the daemon."""
    with Observer(daemon.address) as obs, ClientProc() as c:
        sid = c.ok("open", address=daemon.address)["session_id"]
        c.ok("malloc", nbytes=2 * PAGE, seed=1)
        holder = c.ok("spawn_socket_holder")["pid"]
        try:
            os.kill(c.pid, signal.SIGKILL)  # the client only; the holder lives on with the socket
            c.proc.wait()
            dead_at = time.monotonic()
            assert reclaimed_after(obs, sid, 0, dead_at) < RECLAIM_S
        finally:
            os.kill(holder, signal.SIGKILL)


def test_daemon_killed_clients_keep_their_pages_and_get_a_clear_error_until_it_is_back():
    base = short_dir()
    try:
        d = Daemon(base, capacity="32MiB").start()
        space = ServiceAddressSpace(d.address, lease_batch_pages=1, keep_free_pages=8)
        try:
            a = space.malloc(2 * PAGE)
            space.write(a, pattern(1, 2 * PAGE))
            spare = space.malloc(PAGE)
            space.free(spare)                               # one cached page stays with the client
            d.kill9()
            assert space.read(a, 2 * PAGE) == pattern(1, 2 * PAGE)
            b = space.malloc(PAGE)                          # served by the cached page: no daemon needed
            space.write(b, pattern(2, PAGE))
            t0 = time.monotonic()
            with pytest.raises(ServiceUnavailableError):
                space.malloc(4 * PAGE)
            assert time.monotonic() - t0 < 2.0
            with pytest.raises(ServiceUnavailableError):
                space.lease(1)

            d = Daemon(base, capacity="32MiB").start()      # back, on the same socket
            c = space.malloc(4 * PAGE)                      # a new session serves new pages
            space.write(c, pattern(3, 4 * PAGE))
            assert space.read(a, 2 * PAGE) == pattern(1, 2 * PAGE)
            with Observer(d.address) as obs:
                s = obs.stats()
                assert [x.info.session_id for x in s.sessions] == [space.session.session_id]
                assert s.device.leased_pages == 4           # the old daemon's pages are not its business
                space.free(a)
                space.free(b)
                space.trim()                                # old pages are let go locally, not "returned"
                assert obs.stats().device.leased_pages == space.stats().pages_total == 4
                assert obs.stats().counters.protocol_errors_total == 0
        finally:
            space.close()
            d.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_daemon_stopped_cleanly_tells_its_clients():
    base = short_dir()
    try:
        d = Daemon(base, capacity="32MiB").start()
        with ClientProc() as c:
            c.ok("open", address=d.address, batch=1)
            a = c.ok("malloc", nbytes=PAGE, seed=5)["addr"]
            assert d.stop() == 0                            # SIGTERM: an orderly stop
            assert "stopping" in d.log()
            assert c.ok("check", addr=a, nbytes=PAGE, seed=5)["intact"]
            r = c.call("malloc", nbytes=8 * PAGE, seed=6)
            assert not r["ok"] and r["error"] == "ServiceUnavailableError"
            d = Daemon(base, capacity="32MiB").start()
            assert c.ok("malloc", nbytes=8 * PAGE, seed=6)
            c.ok("close")
        d.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
