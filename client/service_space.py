"""ServiceAddressSpace: an AddressSpace whose physical pages are leased from the per-node daemon.

``AddressSpace(service="unix:///run/vtalloc/vtalloc.sock", ...)`` builds one of these (see
AddressSpace.__new__); everything else is the core API. Owns: the session, the lease (which
daemon page id each imported page is), growing the lease when malloc runs out (lease a
batch, retry), giving pages back (on free above a spare margin, on trim, on close, and when
the daemon asks under pressure), and two background threads: one answers the daemon's
events (Watch), one reports this space's page counts every ``report_interval_s``.

Invariants:
- a page is given back only when it holds no live data (the core's return_pages picks it);
- pages from a daemon that has since restarted are kept and used, and never "returned" to
  the new daemon, which never leased them (each page remembers its session epoch);
- the daemon down: mapped pages and allocations keep working; asking for more pages raises
  ServiceUnavailableError at once; once the daemon is back, the next lease opens a new session;
- leases are serialized (one side-channel reader at a time); giving pages back never waits
  for a lease, so an eviction request is answered even while this process waits for pages;
- background threads hold the space only weakly, and stop when it is closed or collected.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable

import grpc

from vtalloc.allocator.address_space import AddressSpace, _as_u64
from vtalloc.allocator.config import Config, parse_size
from vtalloc.allocator.errors import ClosedError, InvalidArgumentError, OutOfMemoryError, VtallocError
from vtalloc.server.errors import ServiceError, ServiceUnavailableError
from vtalloc.server.proto.vtalloc.v1 import pages_pb2

from .pressure import engine_counters, evict_for_pressure
from .session import DEFAULT_RPC_TIMEOUT_S, ServiceSession

__all__ = ["ServiceAddressSpace", "EvictHandler"]

log = logging.getLogger("vtalloc.client")

# (space, pages asked, give_back(n) -> pages given back) -> pages given back
# The core's page states, as the daemon's PageUse of the leased page behind them.
_PAGE_USE = {"allocated": pages_pb2.PAGE_USE_RESIDENT, "cached": pages_pb2.PAGE_USE_CACHED,
             "free": pages_pb2.PAGE_USE_UNMAPPED, "in_flight": pages_pb2.PAGE_USE_IN_FLIGHT}
EvictHandler = Callable[[Any, int, Callable[[int], int]], int]
_WATCH_RENEW_S = 600.0
_CONFIG_FIELDS_HANDLED = {"backend", "device", "capacity", "page_size", "small_threshold", "host_granularity",
                          "host_capacity", "reservation_size"}
_MAX_LEASE_PAGES = 4096


def default_evict_handler(space: "ServiceAddressSpace", pages: int, give_back: Callable[[int], int]) -> int:
    return evict_for_pressure(space, pages, give_back, space.evictable_addresses())


class _Link:
    """The mutable session state the background threads share with the space."""

    def __init__(self, session: ServiceSession) -> None:
        self.session = session
        self.epoch = 1
        self.stop = threading.Event()
        self.watch_call: Any = None
        self.threads: list[threading.Thread] = []

    def shutdown(self) -> None:
        self.stop.set()
        call = self.watch_call
        if call is not None:
            call.cancel()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        self.session.close()


class ServiceAddressSpace(AddressSpace):
    def __init__(
        self,
        backend: str = "auto",
        device: int | None = None,
        capacity: int | str | None = None,
        page_size: int | str | None = None,
        *,
        service: str,
        small_threshold: int | str | None = None,
        host_granularity: int | str | None = None,
        host_capacity: int | str | None = None,
        reservation_size: int | str | None = None,
        config: Config | None = None,
        leased: bool = True,
        lease_batch_pages: int = 4,
        keep_free_pages: int | None = None,
        rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
        report_interval_s: float = 1.0,
        evict_handler: EvictHandler | None = None,
        **core_options: Any,
    ) -> None:
        """Open a session with the daemon at ``service`` and a leased space over its pages.

        The daemon decides backend, device and page size (a different explicit value is an
        InvalidArgumentError); ``capacity`` caps this client below the node's capacity.
        ``lease_batch_pages``: pages leased at a time when malloc runs out; ``keep_free_pages``:
        unused pages kept after a free (default: one batch); ``evict_handler(space, pages,
        give_back)``: what to do when the daemon asks for pages (default: evict_for_pressure).
        Other keywords go to the core AddressSpace (e.g. the eviction engine's options).
        """
        self._link: _Link | None = None
        if not leased:
            raise InvalidArgumentError("a service-backed address space is always leased")
        if config is not None:
            backend, device, capacity, page_size = config.backend, config.device, config.capacity, config.page_size
            small_threshold, host_capacity = config.small_threshold, config.host_capacity
            reservation_size, host_granularity = config.reservation_size, config.host_granularity
            for f in dataclasses.fields(config):  # fields this class does not know go to the core as they are
                if f.name not in _CONFIG_FIELDS_HANDLED and getattr(config, f.name) != f.default:
                    core_options.setdefault(f.name, getattr(config, f.name))
        self.lease_batch_pages = _as_u64(lease_batch_pages, "lease_batch_pages", positive=True)
        if self.lease_batch_pages > _MAX_LEASE_PAGES:
            raise InvalidArgumentError(f"lease_batch_pages must be at most {_MAX_LEASE_PAGES}")
        self.keep_free_pages = _as_u64(self.lease_batch_pages if keep_free_pages is None else keep_free_pages,
                                       "keep_free_pages")
        if not 0.01 <= report_interval_s <= 3600:
            raise InvalidArgumentError(f"report_interval_s must be 0.01 .. 3600, got {report_interval_s}")
        session = ServiceSession(service, kind="client", timeout_s=rpc_timeout_s)
        h = session.hello
        try:
            if backend not in ("auto", h.backend):
                raise InvalidArgumentError(f"the daemon serves {h.backend} pages, not {backend}")
            if device is not None and device != h.device:
                raise InvalidArgumentError(f"the daemon serves device {h.device}, not {device}")
            if page_size is not None and parse_size(page_size, name="page_size") != h.page_bytes:
                raise InvalidArgumentError(f"the daemon's pages are {h.page_bytes} bytes, not {page_size}")
            ceiling = h.capacity_bytes
            if capacity is not None:
                ceiling = min(ceiling, parse_size(capacity, name="capacity"))
            if h.backend == "host" and host_granularity is None:
                host_granularity = h.page_bytes & -h.page_bytes  # a power of two that divides the page
            super().__init__(
                backend=h.backend, device=h.device, capacity=ceiling, page_size=h.page_bytes,
                small_threshold=small_threshold, host_granularity=host_granularity,
                host_capacity=host_capacity or h.host_capacity_bytes or None,
                reservation_size=reservation_size, leased=True, **core_options)
        except BaseException:
            session.close()
            raise
        self.service_address = session.address
        self.rpc_timeout_s = rpc_timeout_s
        self.report_interval_s = report_interval_s
        self.evict_handler: EvictHandler = evict_handler or default_evict_handler
        self._lease_timeout_s = rpc_timeout_s + 2 * h.evict_deadline_s + 3.0
        self._lease_lock = threading.Lock()      # one lease (one side-channel reader) at a time
        self._pages_lock = threading.Lock()      # the tag map; never held across an RPC
        self._tags: dict[int, tuple[int, int]] = {}  # tag -> (session epoch, daemon page id)
        self._next_tag = 1
        self._unreturned: list[int] = []         # page ids a failed Return still owes this epoch
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._pid = os.getpid()
        self._link = _Link(session)
        self._finalizer = weakref.finalize(self, self._link.shutdown)
        self._start_threads()

    # -- session ------------------------------------------------------------------------------
    @property
    def session(self) -> ServiceSession:
        if self._link is None:
            raise ClosedError("the address space is closed")
        return self._link.session

    def _start_threads(self) -> None:
        link = self._link
        ref = weakref.ref(self)
        watcher = threading.Thread(target=_watch_loop, args=(ref, link, link.session, link.epoch),
                                   name=f"vtalloc-watch-{link.session.session_id}", daemon=True)
        link.threads = [t for t in link.threads if t.is_alive()] + [watcher]
        watcher.start()
        if not any(t.name == "vtalloc-report" and t.is_alive() for t in link.threads):
            reporter = threading.Thread(target=_report_loop, args=(ref, link), name="vtalloc-report", daemon=True)
            link.threads.append(reporter)
            reporter.start()

    def _check_owner(self) -> None:
        # A forked child shares the parent's pages (MAP_SHARED): it must neither allocate on
        # them nor lease or return pages in the parent's name.
        if os.getpid() != self._pid:
            raise ClosedError("this service-backed address space belongs to the parent process; "
                              "create a new one after fork")

    def _live_session(self) -> ServiceSession:
        """The current session, or a new one if the daemon restarted (ServiceUnavailableError if it is down)."""
        self._check_owner()
        link = self._link
        if link is None or self.closed:
            raise ClosedError("the address space is closed")
        if link.session.alive:
            return link.session
        fresh = ServiceSession(self.service_address, kind="client", timeout_s=self.rpc_timeout_s)
        h = fresh.hello
        if (h.backend, h.device, h.page_bytes) != (self.backend, self.device, self.page_bytes):
            fresh.close()
            raise ServiceUnavailableError(
                f"the daemon came back serving {h.backend}:{h.device} pages of {h.page_bytes} bytes; this space "
                f"uses {self.backend}:{self.device} pages of {self.page_bytes} bytes")
        old = link.session
        with self._pages_lock:
            link.session = fresh
            link.epoch += 1
            self._unreturned.clear()
        old.close()
        log.info("the vtalloc daemon came back: new session %s", fresh.session_id)
        self._start_threads()
        return fresh

    # -- leasing ------------------------------------------------------------------------------
    def lease(self, pages: int) -> int:
        """Lease ``pages`` more pages from the daemon now (malloc does this by itself when it runs out)."""
        n = _as_u64(pages, "pages", positive=True)
        if n > _MAX_LEASE_PAGES:
            raise InvalidArgumentError(f"lease at most {_MAX_LEASE_PAGES} pages at once")
        with self._lease_lock:
            session = self._live_session()
            self._flush_unreturned(session)
            reply = session.call(session.pages, "Lease", pages_pb2.LeaseRequest(pages=n), self._lease_timeout_s)
            return self._receive(session, reply.lease_id, list(reply.page_ids))

    def _receive(self, session: ServiceSession, lease_id: int, page_ids: list[int]) -> int:
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
                epoch = self._link.epoch
                for pid in page_ids:
                    fd = arrived.pop(pid)
                    try:
                        tag = self._next_tag
                        self.import_page(fd, tag)
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
            if session is self._link.session and session.alive:
                with self._pages_lock:
                    self._unreturned.extend(page_ids)
            log.debug("could not return %d pages now: %s", len(page_ids), e)

    def _flush_unreturned(self, session: ServiceSession) -> None:
        with self._pages_lock:
            owed, self._unreturned = self._unreturned, []
        self._send_return(session, owed, 0)

    def give_back(self, max_pages: int, evict_request_id: int = 0) -> int:
        """Return up to ``max_pages`` pages holding no live data to the daemon; returns how many."""
        self._check_owner()
        link = self._link
        if link is None:
            raise ClosedError("the address space is closed")
        with self._pages_lock:
            tags = self.return_pages(min(_as_u64(max_pages, "max_pages"), len(self._tags)))
            session, epoch = link.session, link.epoch
            ids = []
            for tag in tags:
                page_epoch, pid = self._tags.pop(tag)
                if page_epoch == epoch:
                    ids.append(pid)
        self._send_return(session, ids, evict_request_id)
        return len(tags)

    def _pages_needed(self, nbytes: int) -> int:
        s = self.stats()
        if nbytes <= s.small_threshold_bytes:
            return 1
        need = -(-nbytes // self.page_bytes)
        return max(1, need - s.pages_free - s.cached_bytes // self.page_bytes)

    # -- the core API, leasing as needed ---------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0, *, evict: bool = True) -> int:
        """As the core's, but a shortage is answered by leasing more pages first; evictable
        pages are evicted (if ``evict``) only when the daemon cannot lease enough."""
        self._check_owner()
        try:
            return super().malloc(nbytes, stream, evict=False)
        except OutOfMemoryError as e:
            if _as_u64(nbytes, "nbytes") > self.capacity_bytes:
                raise
            last: OutOfMemoryError = e
        for _ in range(3):
            need = self._pages_needed(nbytes)
            room = (self.capacity_bytes // self.page_bytes) - self.stats().pages_total
            if room <= 0:
                break
            want = min(max(need, self.lease_batch_pages), room)
            try:
                self.lease(want)
            except OutOfMemoryError as e:
                if want == min(need, room):
                    last = e
                    break
                try:
                    self.lease(min(need, room))  # the batch did not fit the quota or the node; the need may
                except OutOfMemoryError as e2:
                    last = e2
                    break
            try:
                return super().malloc(nbytes, stream, evict=False)
            except OutOfMemoryError as e:
                last = e
        if evict:
            try:
                return super().malloc(nbytes, stream)  # the lease cannot grow: evict what may be evicted
            except OutOfMemoryError:
                pass
        raise last

    def free(self, address: int) -> None:
        self._check_owner()
        self._evictable.pop(address, None)
        super().free(address)
        if self._link is not None:
            s = self.stats()
            spare = s.pages_free + s.cached_bytes // self.page_bytes
            if spare > self.keep_free_pages + self.lease_batch_pages:
                self.give_back(spare - self.keep_free_pages)

    def trim(self) -> int:
        """Give every page holding no live data back to the daemon; returns the bytes given back."""
        self.synchronize()
        return self.give_back(self.stats().pages_total) * self.page_bytes

    def _leasing(self, call: Callable[[], Any], address: int) -> Any:
        """Run a core call that may need device pages (a restore); on a shortage lease what the
        allocation needs, within the ceiling, and try once more."""
        try:
            return call()
        except OutOfMemoryError:
            room = (self.capacity_bytes // self.page_bytes) - self.stats().pages_total
            need = -(-self.size_of(address) // self.page_bytes)
            if room <= 0:
                raise
            self.lease(min(need, room))
            return call()

    def set_evictable(self, address: int, flag: bool = True) -> None:
        """Mark an allocation evictable (the eviction engine may move it to host memory);
        ``flag=False`` restores it first, leasing pages if needed."""
        self._check_owner()
        self._leasing(lambda: AddressSpace.set_evictable(self, address, flag), address)
        self._evictable.pop(address, None)
        if flag:
            self._evictable[address] = None

    def prefetch(self, address: int, stream: int | None = None) -> None:
        self._check_owner()
        self._leasing(lambda: AddressSpace.prefetch(self, address, stream), address)

    def ensure_resident(self, address: int, stream: int | None = None) -> None:
        self._check_owner()
        self._leasing(lambda: AddressSpace.ensure_resident(self, address, stream), address)

    def evictable_addresses(self) -> list[int]:
        """Allocations marked evictable, least recently marked first."""
        return list(self._evictable)

    def close(self) -> None:
        """Release every page, end the session (the daemon takes back the lease). Idempotent."""
        link, self._link = self._link, None
        if link is not None:
            link.stop.set()
            call = link.watch_call
            if call is not None:
                call.cancel()
        try:
            super().close()
        finally:
            if link is not None:
                self._finalizer()

    def report(self) -> pages_pb2.ClientReport:
        """This space's page counts as the daemon receives them."""
        s = self.stats()
        pages = self.pages()
        by_state = collections.Counter(p.state for p in pages)
        uses = [pages_pb2.PageUseReport(page_id=p.tag, use=_PAGE_USE[p.state]) for p in pages
                if p.tag and p.state in _PAGE_USE]  # evicted virtual pages hold no leased page
        return pages_pb2.ClientReport(
            allocated_bytes=s.allocated_bytes, active_bytes=s.active_bytes, mapped_bytes=s.mapped_bytes,
            cached_bytes=s.cached_bytes, pages_total=s.pages_total, pages_allocated=by_state["allocated"],
            pages_cached=by_state["cached"], pages_free=by_state["free"], ooms_total=s.num_ooms,
            page_uses=uses, **engine_counters(s))

    def __repr__(self) -> str:
        base = super().__repr__()
        return base[:-1] + f" service={getattr(self, 'service_address', '?')}>"


def _watch_loop(ref: "weakref.ref[ServiceAddressSpace]", link: _Link, session: ServiceSession, epoch: int) -> None:
    """Answer the daemon's events for one session until it ends or the space closes."""
    while not link.stop.is_set() and link.session is session:
        try:
            call = session.watch(_WATCH_RENEW_S)
        except VtallocError:
            return
        link.watch_call = call
        try:
            for event in call:
                kind = event.WhichOneof("kind")
                if kind == "evict":
                    _answer_eviction(ref, event.evict)
                elif kind == "shutdown":
                    session.mark_dead()
                    return
            return  # the daemon ended the stream: the session is over
        except grpc.RpcError as e:
            if link.stop.is_set() or not session.alive:
                return
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                continue  # a long watch ran out its deadline: renew it
            if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                return
            time.sleep(0.2)
        finally:
            link.watch_call = None


def _answer_eviction(ref: "weakref.ref[ServiceAddressSpace]", request: Any) -> None:
    space = ref()
    if space is None or space.closed:
        return
    request_id = request.request_id

    def give_back(n: int) -> int:
        return space.give_back(n, request_id) if n > 0 else 0

    try:
        returned = space.evict_handler(space, request.pages, give_back)
        log.info("eviction request %d: %d of %d pages given back", request_id, returned, request.pages)
    except VtallocError as e:
        log.warning("eviction request %d failed: %s", request_id, e)


def _report_loop(ref: "weakref.ref[ServiceAddressSpace]", link: _Link) -> None:
    while not link.stop.wait(_interval(ref)):
        space = ref()
        if space is None:
            return
        try:
            report = space.report()
            session = link.session
            del space
            session.call(session.pages, "Report", pages_pb2.ReportRequest(report=report))
        except (VtallocError, NotImplementedError):
            continue  # closed, or the daemon is away: report again next time


def _interval(ref: "weakref.ref[ServiceAddressSpace]") -> float:
    space = ref()
    return 1.0 if space is None else space.report_interval_s
