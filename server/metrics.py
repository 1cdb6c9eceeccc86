"""Prometheus metrics of the daemon, read from the ledger at each scrape.

Owns: metric names and units (base units: bytes, seconds; counters end in ``_total``; no
per-session or per-pid labels, whose cardinality is unbounded: per-session detail is in
``vtalloc stats``), ``vtalloc_build_info``, and the registry served (with prometheus_client's
standard ``process_*`` metrics). Invariants: every ``vtalloc_*`` series carries the node's
``backend`` and ``device`` labels; a page mapped under live allocations is "resident" here as
in the CLI and the protobuf (ClientReport.pages_resident, PAGE_USE_RESIDENT); a scrape reads one
consistent ledger snapshot and changes nothing; counters only ever grow (client-reported
counters are summed as deltas); the HTTP server holds at most METRICS_MAX_CONNECTIONS
connections (more are closed at once), at most METRICS_PER_PEER of them from one peer (a
local uid, asked of the kernel (sock_diag, else ``/proc/net/tcp``); a remote address), each for at most
METRICS_REQUEST_DEADLINE_S and idle at most METRICS_IDLE_TIMEOUT_S, one request per
connection: whoever reaches the port (any local user, on the default 127.0.0.1) cannot make
the daemon hold more descriptors or threads than that, nor one user keep the others out.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import socket
import struct
import threading
import time
from socketserver import ThreadingMixIn
from typing import Iterable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from vtalloc.allocator.errors import InternalError

from .ledger import Ledger
from .protocol.rpc import NODE_COUNTERS
from .reports import saturating_sum
from .views import SessionView

__all__ = ["LedgerCollector", "make_registry", "start_metrics_server", "version", "NODE_LABELS",
           "METRICS_MAX_REGIONS", "OTHER_REGIONS", "regions_paused", "METRICS_MAX_CONNECTIONS", "METRICS_PER_PEER",
           "METRICS_IDLE_TIMEOUT_S", "METRICS_REQUEST_DEADLINE_S", "tcp_peer"]

log = logging.getLogger("vtalloc.server")

METRICS_MAX_CONNECTIONS = 16      # a scraper needs one; a few for people with curl
METRICS_PER_PEER = 4              # of those, one local uid's (or one remote address's)
METRICS_IDLE_TIMEOUT_S = 5.0      # a connection that sends nothing this long is closed
METRICS_REQUEST_DEADLINE_S = 10.0  # and none is held longer, however slowly it sends
_REFUSAL_LOG_EVERY_S = 10.0

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


NODE_LABELS = ("backend", "device")
# Region tags come from clients: the exporter labels at most this many of them, those with the most
# paused bytes, and sums the others under OTHER_REGIONS (no tag can be spelled so: tags have no
# parentheses), so whoever reports tags cannot grow the label set past METRICS_MAX_REGIONS + 1.
METRICS_MAX_REGIONS = 32
OTHER_REGIONS = "(other)"


def regions_paused(sessions: Iterable[SessionView]) -> list[tuple[str, int]]:
    """(tag, paused bytes summed over sessions) for the METRICS_MAX_REGIONS tags with the most, by
    size then name, and OTHER_REGIONS for the rest (when there is any); sums saturate."""
    totals: dict[str, int] = {}
    for s in sessions:
        for r in s.report.regions:
            totals[r.tag] = saturating_sum((totals.get(r.tag, 0), r.paused_bytes))
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    shown, rest = ranked[:METRICS_MAX_REGIONS], ranked[METRICS_MAX_REGIONS:]
    return shown + ([(OTHER_REGIONS, saturating_sum(n for _, n in rest))] if rest else [])


def version() -> str:
    """The installed vtalloc's version ("unknown" when it is run from a tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("vtalloc")
    except PackageNotFoundError:
        return "unknown"


class LedgerCollector(Collector):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        view, _ = ledger.views.metrics_snapshot()
        self.start_time = time.time() - view.uptime_s  # the ledger's start, on the wall clock
        self.version = version()

    def collect(self) -> Iterator:
        view, by_state = self.ledger.views.metrics_snapshot()
        d = view.device
        node = [d.backend, str(d.device)]

        def gauge(name: str, help_text: str, value: float | None = None, labels: tuple[str, ...] = ()):
            family = GaugeMetricFamily(name, help_text, labels=[*labels, *NODE_LABELS])
            if value is not None:
                family.add_metric(node, value)
            return family

        info = InfoMetricFamily("vtalloc_build", "The daemon's vtalloc version and the node it serves.",
                                labels=["version", *NODE_LABELS])
        info.add_metric([self.version, *node], {})
        yield info
        yield gauge("vtalloc_start_time_seconds", "When the daemon started, in seconds since the Unix epoch.",
                    self.start_time)
        yield gauge("vtalloc_page_bytes", "Bytes per physical page.", d.page_bytes)
        yield gauge("vtalloc_capacity_bytes", "Bytes of pages the node may lease.", d.capacity_pages * d.page_bytes)
        pages = gauge("vtalloc_pages", "Physical pages by state (free: neither leased nor inherited; inherited: "
                      "held by live clients of a previous daemon).", labels=("state",))
        for state, n in by_state.items():
            pages.add_metric([state, *node], n)
        yield pages
        reported = gauge("vtalloc_client_pages", "Clients' own count of their pages by state (their last reports): "
                         "resident (mapped under live allocations), cached, unmapped; evicted pages hold data on "
                         "the host, not on the node.", labels=("state",))
        for state, key in (("resident", "pages_resident"), ("cached", "pages_cached"), ("unmapped", "pages_free"),
                           ("evicted", "evicted_pages")):
            reported.add_metric([state, *node], sum(getattr(s.report, key) for s in view.sessions))
        yield reported
        yield gauge("vtalloc_client_sessions", "Live client sessions.", len(view.sessions))
        yield gauge("vtalloc_client_paused_bytes", "Bytes of clients' allocations in paused regions (their reports): "
                    "off the device until resumed.", d.paused_bytes)
        regions = gauge("vtalloc_region_paused_bytes", "Bytes of clients' allocations paused, by region tag, summed "
                        f"over sessions; past {METRICS_MAX_REGIONS} tags the smaller ones are summed as "
                        f"region=\"{OTHER_REGIONS}\".", labels=("region",))
        for tag, n in regions_paused(view.sessions):
            regions.add_metric([tag, *node], n)
        yield regions
        principal = ("principal",)
        leased = gauge("vtalloc_principal_leased_bytes", "Bytes of pages leased to a principal's sessions.",
                       labels=principal)
        evicted = gauge("vtalloc_principal_evicted_bytes",
                        "Bytes of a principal's pages evicted to host memory (client reports).", labels=principal)
        qmin = gauge("vtalloc_principal_quota_min_bytes", "Guaranteed bytes.", labels=principal)
        qmax = gauge("vtalloc_principal_quota_max_bytes", "Hard maximum bytes.", labels=principal)
        rejected = CounterMetricFamily("vtalloc_principal_quota_rejections",
                                       "Leases refused for passing the principal's maximum.",
                                       labels=[*principal, *NODE_LABELS])
        for p in view.principals:
            labels = [p.quota.principal, *node]
            leased.add_metric(labels, p.leased_pages * d.page_bytes)
            evicted.add_metric(labels, p.evicted_bytes)
            qmin.add_metric(labels, p.quota.min_bytes)
            qmax.add_metric(labels, p.quota.max_bytes)
            rejected.add_metric(labels, p.quota_rejections)
        yield from (leased, evicted, qmin, qmax, rejected)
        for key, name, help_text in _COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=list(NODE_LABELS))
            counter.add_metric(node, view.counters[key])
            yield counter


def make_registry(ledger: Ledger) -> CollectorRegistry:
    """The ledger's metrics and prometheus_client's process_* metrics (start time, resident
    memory, open fds, CPU seconds; on Linux), which keep their standard names and no labels."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(ledger))
    ProcessCollector(registry=registry)
    return registry


def _proc_net_address(text: str) -> tuple[str, int]:
    """``0100007F:1F90`` (``/proc/net/tcp``: the address's 32-bit words as the host stores them) as (ip, port)."""
    addr, port = text.split(":")
    raw = b"".join(struct.pack("=I", int(addr[i:i + 8], 16)) for i in range(0, len(addr), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def _normal(ip: str) -> str:
    a = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped:
        a = a.ipv4_mapped
    return str(a)


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, _NLMSG_ERROR = 4, 20, 1, 2
_NOCOOKIE = 0xFFFFFFFF


_GONE = -1   # sock_diag answered: no such socket (it closed already)


def _diag_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the local TCP socket ``client`` connected to ``server``: one exact
    sock_diag lookup (netlink); _GONE when the kernel knows no such socket (here, or any more);
    None when sock_diag cannot be asked (then /proc/net/tcp is read)."""
    a, b = ipaddress.ip_address(client[0]), ipaddress.ip_address(server[0])
    family = socket.AF_INET6 if a.version == 6 else socket.AF_INET
    if a.version != b.version:
        return None
    pad = 16 - len(a.packed)
    sockid = (struct.pack("!HH", client[1], server[1]) + a.packed + b"\0" * pad + b.packed + b"\0" * pad
              + struct.pack("=III", 0, _NOCOOKIE, _NOCOOKIE))
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    msg = struct.pack("=IHHII", 16 + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + body
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(msg)
            reply = nl.recv(8192)
    except OSError:
        return None
    if len(reply) < 16:
        return None
    _, kind = struct.unpack_from("=IH", reply, 0)
    if kind == _NLMSG_ERROR:
        return _GONE
    if kind != _SOCK_DIAG_BY_FAMILY or len(reply) < 16 + 4 + 48 + 16:
        return None
    return struct.unpack_from("=I", reply, 16 + 4 + 48 + 12)[0]   # inet_diag_msg.idiag_uid


def tcp_peer(client: tuple, server: tuple) -> tuple[str, int | str]:
    """Who is at the other end of a TCP connection to ``server`` from ``client`` (addresses as
    accept gives them): ``("uid", n)`` when the connecting socket is on this host (the kernel's
    sock_diag answer for it, else its line in ``/proc/net/tcp`` or ``tcp6``), else
    ``("address", ip)``."""
    want_local, want_remote = (_normal(client[0]), client[1]), (_normal(server[0]), server[1])
    uid = _diag_uid(want_local, want_remote)
    if uid == _GONE:
        return ("address", want_local[0])
    if uid is not None:
        return ("uid", uid)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) < 8:
                        continue
                    try:
                        if (_proc_net_address(fields[1]) == want_local
                                and _proc_net_address(fields[2]) == want_remote):
                            return ("uid", int(fields[7]))
                    except ValueError:
                        continue
        except OSError:
            continue
    return ("address", want_local[0])


class _Handler(WSGIRequestHandler):
    """One request per connection (HTTP/1.0), idle at most METRICS_IDLE_TIMEOUT_S; no access log."""

    timeout = METRICS_IDLE_TIMEOUT_S

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most METRICS_MAX_CONNECTIONS of them, each closed by
    METRICS_REQUEST_DEADLINE_S; connections over the bound are closed at once (and counted)."""

    daemon_threads = True
    block_on_close = False   # stopping never waits for a connection (each ends by its deadline anyway)
    max_connections = METRICS_MAX_CONNECTIONS
    deadline_s = METRICS_REQUEST_DEADLINE_S

    per_peer = METRICS_PER_PEER

    def __init__(self, *args, **kwargs) -> None:
        self._lock = threading.Lock()
        self.active = 0
        self.refused = 0
        self._by_peer: collections.Counter[tuple[str, int | str]] = collections.Counter()
        self._peer_of: dict[int, tuple[str, int | str]] = {}
        self._logged_at: float | None = None
        self._refused_since_log = 0
        super().__init__(*args, **kwargs)

    def verify_request(self, request, client_address) -> bool:
        peer = tcp_peer(client_address, request.getsockname())   # before the lock: it reads procfs
        with self._lock:
            if self.active < self.max_connections and self._by_peer[peer] < self.per_peer:
                self.active += 1
                self._by_peer[peer] += 1
                self._peer_of[id(request)] = peer
                return True
            self.refused += 1
            now = time.monotonic()
            if self._logged_at is not None and now - self._logged_at < _REFUSAL_LOG_EVERY_S:
                self._refused_since_log += 1
                return False
            more = f" ({self._refused_since_log} more since the last line)" if self._refused_since_log else ""
            self._logged_at, self._refused_since_log = now, 0
            full = self.active >= self.max_connections
        why = (f"{self.max_connections} connections open, the limit" if full else
               f"{peer[0]} {peer[1]} has {self.per_peer} connections open, the limit per peer")
        log.warning("metrics: connection from %s closed at once: %s%s",
                    client_address[0] if client_address else "?", why, more)
        return False

    def process_request(self, request, client_address) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread to serve it: the slot comes back, the socket is closed
            self._done(request, request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        # Past the deadline the connection is shut down, which ends any read or write on it.
        timer = threading.Timer(self.deadline_s, _shut, (request,))
        timer.daemon = True
        try:
            timer.start()
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._done(request, None)

    def _done(self, request, shut) -> None:
        with self._lock:
            self.active -= 1
            peer = self._peer_of.pop(id(request), None)
            if peer is not None:
                self._by_peer[peer] -= 1
                if self._by_peer[peer] <= 0:
                    del self._by_peer[peer]
        if shut is not None:
            self.shutdown_request(shut)

    def handle_error(self, request, client_address) -> None:
        """A client that timed out, hung up or sent garbage: its connection ends, nothing more."""
        log.debug("metrics: connection from %s ended with an error", client_address, exc_info=True)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def start_metrics_server(ledger: Ledger, port: int, addr: str = "127.0.0.1"):
    """Serve /metrics on ``addr:port`` (0: any free port), within the bounds above; returns
    (http server, thread)."""
    from prometheus_client import make_wsgi_app

    family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    class Server(_BoundedServer):
        address_family = family

    httpd = make_server(addr, port, make_wsgi_app(make_registry(ledger)), Server, handler_class=_Handler)
    thread = threading.Thread(target=httpd.serve_forever, name="vtalloc-metrics", daemon=True)
    thread.start()
    return httpd, thread
