"""SIGKILL of clients at each lease stage, and of the daemon, with reclaim and restart times.

Owns: the stages (after hello; mid-lease: pages granted, descriptors never read; holding
mapped and written pages; while asked to give pages back and not answering) and the daemon
kill and restart.
Reclaim time: from the kill (the client reaped) to the daemon counting the pages free and the
session gone, polled every 2 ms through an observer. Restart time: from SIGKILL of the daemon
to a new daemon serving a lease on the same socket.
Invariants: after every kill the node's leased pages return to what the survivors hold; a
survivor's bytes are intact; a reclaim that never happens within 10 s is an "other" outcome.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from reliability.common import Tally
from reliability.live import ClientProc, Daemon, Observer, wait_until
from vtalloc.client.session import ServiceSession
from vtalloc.server.proto.vtalloc.v1 import pages_pb2

MiB = 1 << 20


def leased(obs: Observer) -> int:
    return obs.stats().device.leased_pages


def reclaim(t: Tally, obs: Observer, c: ClientProc, session_id: str, stage: str, times: dict[str, list[float]],
            others_hold: int = 0) -> None:
    """``others_hold``: pages a survivor may get from the reclaim (a pending lease)."""
    killed = c.kill9()
    try:
        wait_until(lambda: leased(obs) <= others_hold and session_id not in {s.info.session_id for s in obs.stats().sessions},
                   10, 0.002)
    except TimeoutError:
        t.bad(f"{stage}: pages or session not reclaimed within 10 s")
        return
    times.setdefault(stage, []).append(round((time.monotonic() - killed) * 1000, 2))
    t.ok("reclaimed")


def client_stages(t: Tally, d: Daemon, rounds: int, times: dict[str, list[float]]) -> None:
    with Observer(d.address) as obs:
        for _ in range(rounds):
            with ClientProc() as c:  # after hello, nothing leased
                sid = c.ok("raw_open", address=d.address)["session_id"]
                reclaim(t, obs, c, sid, "after_hello", times)
            with ClientProc() as c:  # the lease granted, its descriptors never read
                sid = c.ok("raw_open", address=d.address)["session_id"]
                c.ok("raw_lease", pages=3)
                reclaim(t, obs, c, sid, "mid_lease", times)
            with ClientProc() as c:  # pages mapped and written
                sid = c.ok("open", address=d.address)["session_id"]
                for i in range(3):
                    c.ok("malloc", nbytes=3 * MiB, seed=i)
                reclaim(t, obs, c, sid, "holding_pages", times)
            with ClientProc() as holder:  # asked to give pages back, it never answers
                sid = holder.ok("open", address=d.address, evict="stuck")["session_id"]
                holder.ok("lease", pages=obs.stats().device.capacity_pages)  # the whole node
                asker = ServiceSession(d.address, timeout_s=10)
                try:
                    future = asker.pages.Lease.future(pages_pb2.LeaseRequest(pages=1), timeout=10,
                                                      metadata=((("x-vtalloc-session", asker._token)),))
                    time.sleep(0.05)  # the eviction request is out
                    reclaim(t, obs, holder, sid, "during_eviction_request", times, others_hold=1)
                    try:
                        future.result()
                    except Exception:  # noqa: BLE001 - either outcome is fine once the holder is dead
                        pass
                finally:
                    asker.close()


def daemon_kill(t: Tally, rounds: int, times: dict[str, list[float]]) -> dict[str, Any]:
    notes: dict[str, Any] = {}
    d = Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB")).start()
    try:
        with ClientProc() as c:
            c.ok("open", address=d.address)
            addr = c.ok("malloc", nbytes=6 * MiB, seed=7)["addr"]
            for _ in range(rounds):
                d.kill9()
                t0 = time.monotonic()
                d.start()
                try:
                    with ServiceSession(d.address, timeout_s=10) as s:
                        s.call(s.pages, "Lease", pages_pb2.LeaseRequest(pages=1), 10)
                        _, fds = s.recv_pages(10)
                        for fd in fds:
                            os.close(fd)
                except Exception as e:  # noqa: BLE001
                    t.bad(f"restart: no lease served: {type(e).__name__}: {e}")
                    continue
                times.setdefault("daemon_restart_to_first_lease", []).append(round((time.monotonic() - t0) * 1000, 1))
                if c.ok("check", addr=addr, nbytes=6 * MiB, seed=7)["intact"]:
                    t.ok("client bytes intact")
                else:
                    t.bad("after the daemon's restart a client's mapped bytes changed")
            with Observer(d.address) as obs:
                dev = obs.stats().device
                notes["restarted_daemon_counts_free_pages"] = dev.free_pages
                notes["restarted_daemon_counts_inherited_pages"] = dev.inherited_pages
                notes["pages_the_old_client_still_maps"] = 3
                # What the old client still maps is not free: the new daemon must know it.
                if dev.inherited_pages >= 3 and dev.free_pages <= dev.capacity_pages - 3:
                    t.ok("restart accounting true")
                else:
                    t.bad(f"restarted daemon over-commits: {dev.free_pages} of {dev.capacity_pages} pages free, "
                          f"{dev.inherited_pages} inherited, while the old client maps 3")
    finally:
        d.stop()
    return notes


def run(scale: int, seed: int) -> dict[str, Any]:
    t = Tally()
    times: dict[str, list[float]] = {}
    with Daemon(capacity="32MiB", args=("--default-quota", "0:1GiB")) as d:
        client_stages(t, d, scale, times)
    notes = daemon_kill(t, scale, times)
    summary = {k: {"n": len(v), "median_ms": statistics.median(v), "max_ms": max(v)} for k, v in times.items()}
    return {"kills": t, "reclaim_ms": summary, "restart": notes}
