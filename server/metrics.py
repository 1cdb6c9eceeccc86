"""Prometheus metrics of the daemon, read from the ledger at each scrape.

Owns: metric names and units (base units: bytes, seconds; counters end in ``_total``; no
per-session or per-pid labels, whose cardinality is unbounded: per-session detail is in
``vtalloc stats``). Invariant: a scrape reads one consistent ledger snapshot and changes
nothing; counters only ever grow (client-reported counters are summed as deltas).
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from vtalloc.allocator.errors import InternalError

from .ledger import Ledger
from .protocol.rpc import NODE_COUNTERS

__all__ = ["LedgerCollector", "make_registry", "start_metrics_server"]

# (node counter, metric name without _total, help); every node counter (NODE_COUNTERS, the
# proto's list) has its metric: a counter added to the proto without one fails the import.
_COUNTERS = (
    ("sessions_total", "vtalloc_sessions", "Client sessions opened."),
    ("leases_total", "vtalloc_leases", "Leases served."),
    ("pages_leased_total", "vtalloc_leased_pages", "Pages leased to clients."),
    ("pages_returned_total", "vtalloc_returned_pages", "Pages clients gave back."),
    ("quota_rejections_total", "vtalloc_quota_rejections", "Leases refused at once: past the principal's maximum."),
    ("node_short_rejections_total", "vtalloc_node_short_rejections",
     "Leases refused because the node stayed short of pages."),
    ("evict_requests_total", "vtalloc_evict_requests", "Eviction requests sent to clients."),
    ("evict_pages_asked_total", "vtalloc_evict_requested_pages", "Pages asked back by eviction requests."),
    ("evict_pages_returned_total", "vtalloc_evict_returned_pages", "Pages given back in answer to eviction requests."),
    ("deadline_misses_total", "vtalloc_evict_deadline_misses", "Eviction requests answered too little, too late."),
    ("kills_total", "vtalloc_kills", "Clients killed for missing an eviction deadline."),
    ("reclaims_total", "vtalloc_reclaims", "Sessions whose client died or vanished; their pages were reclaimed."),
    ("reclaimed_pages_total", "vtalloc_reclaimed_pages", "Pages reclaimed from such sessions."),
    ("evictions_total", "vtalloc_evictions", "Pages clients evicted to host memory (their reports)."),
    ("restores_total", "vtalloc_restores", "Pages clients restored from host memory (their reports)."),
    ("protocol_errors_total", "vtalloc_side_channel_protocol_errors",
     "Side-channel connections dropped, and client reports refused, for bad input."),
)
if sorted(key for key, _, _ in _COUNTERS) != sorted(NODE_COUNTERS):
    raise InternalError("metrics.py: every node counter of pages.proto needs exactly one metric; "
                        f"differences: {sorted(set(NODE_COUNTERS) ^ {key for key, _, _ in _COUNTERS})}")


class LedgerCollector(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator:
        view, by_state = self.ledger.metrics_snapshot()
        d = view.device
        yield GaugeMetricFamily("vtalloc_page_bytes", "Bytes per physical page.", value=d.page_bytes)
        yield GaugeMetricFamily("vtalloc_capacity_bytes", "Bytes of pages the node may lease.",
                                value=d.capacity_pages * d.page_bytes)
        pages = GaugeMetricFamily("vtalloc_pages", "Physical pages by state (free: neither leased nor "
                                  "inherited; inherited: held by live clients of a previous daemon).", labels=["state"])
        for state, n in by_state.items():
            pages.add_metric([state], n)
        yield pages
        reported = GaugeMetricFamily(
            "vtalloc_client_pages", "Clients' own count of their pages by state (their last reports); "
            "evicted pages hold data on the host, not on the node.", labels=["state"])
        for state, key in (("allocated", "pages_allocated"), ("cached", "pages_cached"), ("unmapped", "pages_free"),
                           ("evicted", "evicted_pages")):
            reported.add_metric([state], sum(getattr(s.report, key) for s in view.sessions))
        yield reported
        yield GaugeMetricFamily("vtalloc_client_sessions", "Live client sessions.", value=len(view.sessions))
        resident = GaugeMetricFamily("vtalloc_principal_resident_bytes",
                                     "Bytes of pages leased to a principal's sessions.", labels=["principal"])
        evicted = GaugeMetricFamily("vtalloc_principal_evicted_bytes",
                                    "Bytes of a principal's pages evicted to host memory (client reports).",
                                    labels=["principal"])
        qmin = GaugeMetricFamily("vtalloc_principal_quota_min_bytes", "Guaranteed bytes.", labels=["principal"])
        qmax = GaugeMetricFamily("vtalloc_principal_quota_max_bytes", "Hard maximum bytes.", labels=["principal"])
        rejected = CounterMetricFamily("vtalloc_principal_quota_rejections",
                                       "Leases refused for passing the principal's maximum.", labels=["principal"])
        for p in view.principals:
            name = [p.quota.principal]
            resident.add_metric(name, p.leased_pages * d.page_bytes)
            evicted.add_metric(name, p.evicted_bytes)
            qmin.add_metric(name, p.quota.min_bytes)
            qmax.add_metric(name, p.quota.max_bytes)
            rejected.add_metric(name, p.quota_rejections)
        yield from (resident, evicted, qmin, qmax, rejected)
        for key, name, help_text in _COUNTERS:
            yield CounterMetricFamily(name, help_text, value=view.counters[key])
        yield GaugeMetricFamily("vtalloc_uptime_seconds", "Seconds since the daemon started.", value=view.uptime_s)


def make_registry(ledger: Ledger) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(ledger))
    return registry


def start_metrics_server(ledger: Ledger, port: int, addr: str = "127.0.0.1"):
    """Serve /metrics on ``addr:port`` (0: any free port); returns (http server, thread)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=addr, registry=make_registry(ledger))
