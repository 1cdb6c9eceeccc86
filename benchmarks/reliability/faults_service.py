"""Fault injection in a service-backed space: lease (pages imported from the daemon and
mapped) and return (pages unmapped and given back), against a live daemon.

Owns: the lease and return operations of the fault campaign. Same method and checks as
faults.py (fault_sweep.py's sweep); besides, after close the daemon must count the session's
pages back (no page leaked on the node).
"""

from __future__ import annotations

from reliability.common import Tally
from reliability.fault_sweep import World, sweep
from reliability.live import Daemon, Observer, wait_until
from vtalloc.client import ServiceAddressSpace

MiB = 1 << 20


def _lease(w: World) -> None:
    w.space.lease(3)
    w.ctx["new"] = w.space.malloc(5 * MiB)  # maps the leased pages


def _setup_return(w: World) -> None:
    w.alloc(MiB, 40)
    w.space.free(w.space.malloc(6 * MiB))


def _return(w: World) -> None:
    w.space.give_back(8)


def run_into(t: Tally, sites: dict[str, int], limit: int) -> None:
    with Daemon(capacity="64MiB", args=("--default-quota", "0:1GiB")) as d, Observer(d.address) as obs:
        def make() -> ServiceAddressSpace:
            return ServiceAddressSpace(d.address, lease_batch_pages=1, report_interval_s=60.0)

        for name, setup, op in (("lease", lambda w: w.alloc(MiB, 41), _lease), ("return", _setup_return, _return)):
            sweep(t, sites, name, make, setup, op, limit)
            try:
                wait_until(lambda: obs.stats().device.leased_pages == 0, 10)
            except TimeoutError:
                t.bad(f"{name}: the daemon still counts {obs.stats().device.leased_pages} pages leased after close")
