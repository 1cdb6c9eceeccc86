"""Concurrency: P client processes against one daemon, each running N lease/malloc/write/
read/free/return rounds (tests/helpers/service_client.py "churn", one thread per process),
while the test process hammers one local space from T threads; totals must balance.

Owns: the concurrency campaign and its totals.
Invariants: every page leased is returned (the node counts 0 leased at the end); every byte
read back equals what was written; in the local space allocations == frees and the books
agree; nothing is held after close.
"""

from __future__ import annotations

import threading
from typing import Any

from reliability.common import Tally, leaks, pattern, space_consistent
from reliability.live import ClientProc, Daemon, Observer, wait_until
from vtalloc.allocator import AddressSpace

MiB = 1 << 20


def local_threads(t: Tally, threads: int, ops: int, seed: int) -> dict[str, int]:
    totals = {"malloc": 0, "free": 0, "bytes_checked": 0, "corrupt": 0}
    lock = threading.Lock()
    with AddressSpace(backend="host", capacity="64MiB") as s:
        def worker(k: int) -> None:
            mine = {"malloc": 0, "free": 0, "bytes_checked": 0, "corrupt": 0}
            for i in range(ops):
                n = 512 << ((k + i) % 13)
                a = s.malloc(n)
                mine["malloc"] += 1
                data = pattern(seed * 1000 + k * ops + i, n)
                s.write(a, data)
                mine["corrupt"] += s.read(a, n) != data
                mine["bytes_checked"] += n
                s.free(a)
                mine["free"] += 1
            with lock:
                for key, v in mine.items():
                    totals[key] += v

        pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
        st = s.stats()
        if (why := space_consistent(s)) or st.num_live_allocs or st.num_allocs != totals["malloc"] \
                or st.num_frees != totals["free"] or totals["corrupt"]:
            t.bad(f"local threads: {why}, {st.num_allocs} allocs / {st.num_frees} frees vs {totals}")
        else:
            t.ok("balanced")
    return totals


def run(scale: int, seed: int) -> dict[str, Any]:
    t = Tally()
    procs, rounds, threads, ops = 2 + scale, 10 * scale, 4, 100 * scale
    with Daemon(capacity="64MiB", args=("--default-quota", "0:1GiB")) as d, Observer(d.address) as obs:
        clients = [ClientProc() for _ in range(procs)]
        try:
            for c in clients:
                c.ok("open", address=d.address)
            for k, c in enumerate(clients):
                c.send("churn", rounds=rounds, seed=seed + k)
            results = [c.recv(120) for c in clients]
            for c in clients:
                c.ok("close")
        finally:
            for c in clients:
                c.close()
        local = local_threads(t, threads, ops, seed)
        try:
            wait_until(lambda: obs.stats().device.leased_pages == 0, 10)
        except TimeoutError:
            t.bad(f"{obs.stats().device.leased_pages} pages still leased after every client closed")
    service = {"leased": sum(r.get("leased", 0) for r in results), "returned": sum(r.get("returned", 0) for r in results),
               "corrupt": sum(r.get("corrupt", 0) for r in results), "held_at_end": sum(r.get("held", 0) for r in results)}
    for r in results:
        if not r.get("ok") or r["corrupt"] or r["leased"] != r["returned"]:
            t.bad(f"churn client: {r}")
        else:
            t.ok("balanced")
    return {"balance": t, "service": {"processes": procs, "rounds_each": rounds, **service},
            "local": {"threads": threads, "ops_each": ops, **local}, "leaks_after": leaks()}
