"""Many clients at once: 32 processes doing thousands of lease/return round trips lose nothing."""

from __future__ import annotations

import contextlib

from helpers.service import ClientProc, Daemon, Observer

CLIENTS = 32
ROUNDS = 40  # per client: a lease, a checked write, a return; 32 x 40 x 2 = 2560 calls, plus page deliveries


def test_32_concurrent_clients_lease_and_return_with_nothing_lost():
    with Daemon(capacity="256MiB") as d, contextlib.ExitStack() as stack:
        clients = [stack.enter_context(ClientProc()) for _ in range(CLIENTS)]
        for c in clients:
            c.send("open", address=d.address, batch=1, keep_free=64, report_interval=0.5)  # returns: explicit only
        for c in clients:
            assert c.recv(60)["ok"]
        for i, c in enumerate(clients):
            c.send("churn", rounds=ROUNDS, seed=i + 1)
        results = [c.recv(240) for c in clients]
        for r in results:
            assert r["ok"], r
            assert r["corrupt"] == 0 and r["held"] == 0
            assert r["leased"] == r["returned"] >= ROUNDS
        with Observer(d.address) as obs:
            s = obs.stats()
            assert len(s.sessions) == CLIENTS
            assert s.device.leased_pages == s.device.delivering_pages == 0
            assert s.device.free_pages == s.device.capacity_pages
            c = s.counters
            assert c.leases_total == CLIENTS * ROUNDS
            assert c.pages_leased_total == c.pages_returned_total == sum(r["leased"] for r in results)
            assert c.reclaims_total == 0 and c.protocol_errors_total == 0
        for c in clients:
            c.ok("close")
        with Observer(d.address) as obs:
            assert obs.stats().sessions == []
        assert "Traceback" not in d.log()
