"""LeaseSource: the page source of a service-backed space: its pages are leased from the daemon.

Owns: the session, the lease (which daemon page id each imported page is), growing the lease
when the space runs short (lease a batch, or just what is needed), giving pages back (after
a free above a spare margin, on trim, on close, and when the daemon asks under pressure),
and the two background threads of lease_threads.py. A leased AddressSpace calls it through
the PageSource protocol (allocator/page_source.py); service_space.py builds the pair. Before
a restore it leases what the allocation lacks, so the core evicts the space's own
allocations only when the node or the quota has no page (issue 11, finding 10).

Invariants:
- a page is given back only when it holds no live data (the core's return_pages picks it);
- pages from a daemon that has since restarted are kept and used, and never "returned" to
  the new daemon, which never leased them (each page remembers its session epoch);
- the daemon down: mapped pages and allocations keep working; asking for more pages raises
  ServiceUnavailableError at once; once the daemon is back, the next lease opens a new session;
- leases are serialized (one side-channel reader at a time); giving pages back never waits
  for a lease, so an eviction request is answered even while this process waits for pages;
- it holds its space only weakly, and so do the background threads, which stop when the
  space is closed or collected; a forked child can neither lease nor give back.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

from vtalloc.allocator._handle import Unique
from vtalloc.allocator.checks import as_u64
from vtalloc.allocator.config import Config
from vtalloc.allocator.errors import ClosedError, InvalidArgumentError, OutOfMemoryError
from vtalloc.allocator.page_source import PageSource
from vtalloc.server.proto.vtalloc.v1 import pages_pb2
from vtalloc.server.protocol.errors import ServiceError, ServiceUnavailableError
from vtalloc.server.protocol.rpc import MAX_LEASE_PAGES, MAX_REPORT_REGIONS

from .lease_threads import Link, start_threads
from .pressure import engine_counters
from .session import DEFAULT_RPC_TIMEOUT_S, ServiceSession

__all__ = ["LeaseSource", "EvictHandler", "DEFAULT_LEASE_BATCH_PAGES", "DEFAULT_REPORT_INTERVAL_S"]

log = logging.getLogger("vtalloc.client")

# (space, pages asked, give_back(n) -> pages given back) -> pages given back
EvictHandler = Callable[[Any, int, Callable[[int], int]], int]
DEFAULT_LEASE_BATCH_PAGES = 4
DEFAULT_REPORT_INTERVAL_S = 1.0
_REPORT_INTERVAL_RANGE_S = (0.01, 3600.0)
# A lease may wait for other clients to answer eviction requests: twice the daemon's
# deadline (ask, then kill and reclaim) and a margin for the delivery, beyond the RPC's own.
_LEASE_MARGIN_S = 3.0
# The core's page states, as the daemon's PageUse of the leased page behind them: an allocated page
# (under live data) with a leased page behind it has its bytes there, so it is resident (glossary).
_PAGE_USE = {"allocated": pages_pb2.PAGE_USE_RESIDENT, "cached": pages_pb2.PAGE_USE_CACHED,
             "free": pages_pb2.PAGE_USE_UNMAPPED, "in_flight": pages_pb2.PAGE_USE_IN_FLIGHT}


class LeaseSource(Unique, PageSource):
    def __init__(self, address: str | None, *, evict_handler: EvictHandler,
                 lease_batch_pages: int = DEFAULT_LEASE_BATCH_PAGES, keep_free_pages: int | None = None,
                 rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
                 report_interval_s: float = DEFAULT_REPORT_INTERVAL_S) -> None:
        """Check the settings, then open a session with the daemon at ``address``."""
        self._link: Link | None = None
        self._finalizer: weakref.finalize | None = None
        self.lease_batch_pages = as_u64(lease_batch_pages, "lease_batch_pages", positive=True)
        if self.lease_batch_pages > MAX_LEASE_PAGES:
            raise InvalidArgumentError(f"lease_batch_pages must be at most {MAX_LEASE_PAGES}")
        self.keep_free_pages = as_u64(self.lease_batch_pages if keep_free_pages is None else keep_free_pages,
                                      "keep_free_pages")
        low, high = _REPORT_INTERVAL_RANGE_S
        if not low <= report_interval_s <= high:
            raise InvalidArgumentError(f"report_interval_s must be {low:g} .. {high:g}, got {report_interval_s}")
        self.rpc_timeout_s = rpc_timeout_s
        self.report_interval_s = report_interval_s
        self.evict_handler = evict_handler
        session = ServiceSession(address, kind="client", timeout_s=rpc_timeout_s)
        self.hello = h = session.hello
        self.service_address = session.address
        self._lease_timeout_s = rpc_timeout_s + 2 * h.evict_deadline_s + _LEASE_MARGIN_S
        self._lease_lock = threading.Lock()      # one lease (one side-channel reader) at a time
        self._pages_lock = threading.Lock()      # the tag map; never held across an RPC
        self._tags: dict[int, tuple[int, int]] = {}  # tag -> (session epoch, daemon page id)
        self._next_tag = 1
        self._unreturned: list[int] = []         # page ids a failed Return still owes this epoch
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._pid = os.getpid()
        self._link = Link(session)

    def fit(self, config: Config) -> Config:
        """``config`` as the daemon serves it: its backend, device and page size (a different
        explicit value is an InvalidArgumentError), a capacity capped by the node's."""
        h = self.hello
        if config.backend not in ("auto", h.backend):
            raise InvalidArgumentError(f"the daemon serves {h.backend} pages, not {config.backend}")
        if config.device != h.device:
            raise InvalidArgumentError(f"the daemon serves device {h.device}, not {config.device}")
        if config.page_size is not None and config.page_size != h.page_bytes:
            raise InvalidArgumentError(f"the daemon's pages are {h.page_bytes} bytes, not {config.page_size}")
        ceiling = h.capacity_bytes if config.capacity is None else min(h.capacity_bytes, config.capacity)
        granularity = config.host_granularity
        if h.backend == "host" and granularity is None:
            granularity = h.page_bytes & -h.page_bytes  # a power of two that divides the page
        return config.replace(backend=h.backend, capacity=ceiling, page_size=h.page_bytes,
                              host_granularity=granularity,
                              host_capacity=config.host_capacity or h.host_capacity_bytes or None)

    # -- the PageSource protocol ----------------------------------------------------------------
    def _live_link(self) -> Link:
        if self._link is None:
            raise ClosedError("the address space is closed")
        return self._link

    def attach(self, space: Any) -> None:
        link = self._live_link()
        self._finalizer = weakref.finalize(space, link.shutdown)
        start_threads(weakref.ref(space), link)

    def check_usable(self) -> None:
        # A forked child shares the parent's pages (MAP_SHARED): it must neither allocate on
        # them nor lease or return pages in the parent's name.
        if os.getpid() != self._pid:
            raise ClosedError("this service-backed address space belongs to the parent process; "
                              "create a new one after fork")

    def on_shortage(self, space: Any, nbytes: int, *, restore: bool) -> bool:
        page = space.page_bytes
        room = space.capacity_bytes // page - space.stats().pages_total
        if room <= 0:
            return False
        if restore:
            self.lease(space, min(-(-nbytes // page), room))
            return True
        need = min(self._pages_needed(space, nbytes), room)
        want = min(max(need, self.lease_batch_pages), room)
        try:
            self.lease(space, want)
        except OutOfMemoryError:
            if want == need:
                raise
            self.lease(space, need)  # the batch did not fit the quota or the node; the need may
        return True

    def before_restore(self, space: Any, address: int) -> None:
        # Without this, a restore after a pressure episode found no spare page and the core
        # evicted the space's least recently used allocation, while the node had pages free.
        try:
            if space.residency(address) != "evicted":
                return
            page = space.page_bytes
            s = space.stats()
            need = sum(1 for p in space.pages() if p.state == "evicted" and address in p.allocations)
            short = need - s.pages_free - s.cached_bytes // page
            room = space.capacity_bytes // page - s.pages_total
            if short <= 0 or room <= 0:
                return
            want = min(max(short, self.lease_batch_pages), room)
            try:
                self.lease(space, want)
            except OutOfMemoryError:
                if want > short:
                    self.lease(space, min(short, room))
        except (OutOfMemoryError, ServiceError) as e:  # the node or the quota has none: the core evicts
            log.debug("no pages leased before restoring %#x: %s", address, e)

    def after_free(self, space: Any, address: int) -> None:
        self._evictable.pop(address, None)
        if self._link is not None:
            s = space.stats()
            spare = s.pages_free + s.cached_bytes // space.page_bytes
            if spare > self.keep_free_pages + self.lease_batch_pages:
                self.give_back(space, spare - self.keep_free_pages)

    def after_set_evictable(self, space: Any, address: int, flag: bool) -> None:
        self._evictable.pop(address, None)
        if flag:
            self._evictable[address] = None

    def after_pause(self, space: Any, page_bytes: int) -> None:
        # The pages a paused region left hold nothing now: back to the node, where another client
        # may lease them; the resume leases again (docs/regions.md).
        if self._link is not None:
            self.give_back(space, page_bytes // space.page_bytes)

    def trim(self, space: Any) -> int:
        space.synchronize()
        return self.give_back(space, space.stats().pages_total) * space.page_bytes

    def stop(self) -> None:
        link = self._link
        if link is not None:
            link.stop.set()
            call = link.watch_call
            if call is not None:
                call.cancel()

    def close(self) -> None:
        """End the session (the daemon releases the lease's pages) and the threads. Idempotent."""
        link, self._link = self._link, None
        if link is None:
            return
        if self._finalizer is not None:
            self._finalizer()
        else:
            link.shutdown()

    def describe(self) -> str:
        return f"service={self.service_address}"

    # -- session --------------------------------------------------------------------------------
    @property
    def session(self) -> ServiceSession:
        if self._link is None:
            raise ClosedError("the address space is closed")
        return self._link.session

    def evictable_addresses(self) -> list[int]:
        """Allocations marked evictable, least recently marked first."""
        return list(self._evictable)

    def _live_session(self, space: Any) -> ServiceSession:
        """The current session, or a new one if the daemon restarted (ServiceUnavailableError if it is down)."""
        self.check_usable()
        link = self._link
        if link is None or space.closed:
            raise ClosedError("the address space is closed")
        if link.session.alive:
            return link.session
        fresh = ServiceSession(self.service_address, kind="client", timeout_s=self.rpc_timeout_s)
        h, first = fresh.hello, self.hello
        if (h.backend, h.device, h.page_bytes) != (first.backend, first.device, first.page_bytes):
            fresh.close()
            raise ServiceUnavailableError(
                f"the daemon came back serving {h.backend}:{h.device} pages of {h.page_bytes} bytes; this space "
                f"uses {first.backend}:{first.device} pages of {first.page_bytes} bytes")
        old = link.session
        with self._pages_lock:
            link.session = fresh
            link.epoch += 1
            self._unreturned.clear()
        old.close()
        log.info("the vtalloc daemon came back: new session %s", fresh.session_id)
        start_threads(weakref.ref(space), link)
        return fresh

    # -- leasing --------------------------------------------------------------------------------
    def lease(self, space: Any, pages: int) -> int:
        """Lease ``pages`` more pages from the daemon into ``space`` now; returns how many came."""
        n = as_u64(pages, "pages", positive=True)
        if n > MAX_LEASE_PAGES:
            raise InvalidArgumentError(f"lease at most {MAX_LEASE_PAGES} pages at once")
        with self._lease_lock:
            session = self._live_session(space)
            self._flush_unreturned(session)
            reply = session.call(session.pages, "Lease", pages_pb2.LeaseRequest(pages=n), self._lease_timeout_s)
            return self._receive(space, session, reply.lease_id, list(reply.page_ids))

    def _receive(self, space: Any, session: ServiceSession, lease_id: int, page_ids: list[int]) -> int:
        wanted = set(page_ids)
        arrived: dict[int, int] = {}
        imported: set[int] = set()
        deadline = time.monotonic() + self.rpc_timeout_s
        try:
            while len(arrived) < len(wanted):
                msg, fds = session.recv_pages(max(0.01, deadline - time.monotonic()))
                ids = msg["page_ids"]
                if msg.get("lease_id") != lease_id:
                    # From an earlier lease whose answer never reached us: those pages are
                    # ours on the daemon's books; give them straight back.
                    for fd in fds:
                        os.close(fd)
                    self._send_return(session, [i for i in ids if isinstance(i, int)], 0)
                    continue
                for pid, fd in zip(ids, fds):
                    if pid in wanted and pid not in arrived:
                        arrived[pid] = fd
                    else:
                        os.close(fd)
            with self._pages_lock:
                epoch = self._live_link().epoch
                for pid in page_ids:
                    fd = arrived.pop(pid)
                    try:
                        tag = self._next_tag
                        space.import_page(fd, tag)
                        self._next_tag += 1
                        self._tags[tag] = (epoch, pid)
                        imported.add(pid)
                    finally:
                        os.close(fd)
            return len(imported)
        except BaseException:
            for fd in arrived.values():
                os.close(fd)
            self._send_return(session, [p for p in page_ids if p not in imported], 0)
            raise

    def _send_return(self, session: ServiceSession, page_ids: list[int], evict_request_id: int) -> None:
        if not page_ids:
            return
        try:
            session.call(session.pages, "Return",
                         pages_pb2.ReturnRequest(page_ids=page_ids, evict_request_id=evict_request_id))
        except ServiceError as e:
            link = self._link
            if link is not None and session is link.session and session.alive:
                with self._pages_lock:
                    self._unreturned.extend(page_ids)
            log.debug("could not return %d pages now: %s", len(page_ids), e)

    def _flush_unreturned(self, session: ServiceSession) -> None:
        with self._pages_lock:
            owed, self._unreturned = self._unreturned, []
        self._send_return(session, owed, 0)

    def give_back(self, space: Any, max_pages: int, evict_request_id: int = 0) -> int:
        """Give back up to ``max_pages`` pages of ``space`` holding no live data to the daemon; returns how many."""
        self.check_usable()
        link = self._link
        if link is None:
            raise ClosedError("the address space is closed")
        with self._pages_lock:
            tags = space.return_pages(min(as_u64(max_pages, "max_pages"), len(self._tags)))
            session, epoch = link.session, link.epoch
            ids = []
            for tag in tags:
                page_epoch, pid = self._tags.pop(tag)
                if page_epoch == epoch:
                    ids.append(pid)
        self._send_return(session, ids, evict_request_id)
        return len(tags)

    @staticmethod
    def _pages_needed(space: Any, nbytes: int) -> int:
        s = space.stats()
        if nbytes <= s.small_threshold_bytes:
            return 1
        need = -(-nbytes // space.page_bytes)
        return max(1, need - s.pages_free - s.cached_bytes // space.page_bytes)

    # -- reports --------------------------------------------------------------------------------
    def report(self, space: Any) -> pages_pb2.ClientReport:
        """The space's page counts as the daemon receives them."""
        s = space.stats()
        pages = space.pages()
        by_state = collections.Counter(p.state for p in pages)
        # A page's tag is this client's name for it; the daemon knows it by its page id, and only
        # the pages leased in this session epoch (a restarted daemon never leased the older ones).
        with self._pages_lock:
            epoch = self._link.epoch if self._link is not None else None
            ids = {tag: pid for tag, (e, pid) in self._tags.items() if e == epoch}
        uses = [pages_pb2.PageUseReport(page_id=ids[p.tag], use=_PAGE_USE[p.state]) for p in pages
                if p.tag in ids and p.state in _PAGE_USE]  # evicted virtual pages hold no leased page
        regions = space.regions()
        named = sorted(regions, key=lambda r: (-r.paused_bytes, -r.bytes, r.tag))[:MAX_REPORT_REGIONS]
        return pages_pb2.ClientReport(
            allocated_bytes=s.allocated_bytes, active_bytes=s.active_bytes, mapped_bytes=s.mapped_bytes,
            cached_bytes=s.cached_bytes, pages_total=s.pages_total, pages_resident=by_state["allocated"],
            pages_cached=by_state["cached"], pages_free=by_state["free"], ooms_total=s.num_ooms,
            page_uses=uses, paused_bytes=sum(r.paused_bytes for r in regions),
            regions=[pages_pb2.RegionReport(tag=r.tag, bytes=r.bytes, paused_bytes=r.paused_bytes,
                                            host_bytes=r.host_bytes) for r in named if r.bytes or r.paused_bytes],
            **engine_counters(s))
