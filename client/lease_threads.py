"""The background threads of a lease: one answers the daemon's events, one reports page counts.

Owns: :class:`Link` (the session state the threads share with the lease: the session, its
epoch, the stop flag, the Watch call) and the two loops. The Watch thread answers eviction
requests with the lease's ``evict_handler`` and notices a daemon shutdown; the report thread
sends the space's page counts every ``report_interval_s``.
Invariants: a thread holds the space only through a weak reference, taken for one step at a
time, so it never keeps a space alive; both stop when the space closes (the stop flag, the
Watch call cancelled) or is collected; one Watch thread per session, one report thread per
link. Errors of the daemon never escape a thread: they end it, or it tries again next time.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

import grpc

from vtalloc.allocator._handle import Unique
from vtalloc.allocator.errors import VtallocError
from vtalloc.server.proto.vtalloc.v1 import pages_pb2

from .session import ServiceSession

__all__ = ["Link", "start_threads"]

log = logging.getLogger("vtalloc.client")

WATCH_RENEW_S = 600.0      # a Watch call's deadline; renewed when it runs out
# After a Watch that failed for another reason (and gRPC's own retries of it, session.py): a
# pause that doubles from the first to the last while failures repeat, reset by an event.
WATCH_BACKOFF_S = (0.05, 2.0)
THREAD_JOIN_S = 5.0        # how long closing waits for each thread
_REPORT_THREAD = "vtalloc-report"


class Link(Unique):
    """The mutable session state the background threads share with the lease."""

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
                t.join(timeout=THREAD_JOIN_S)
        self.session.close()


def start_threads(ref: "weakref.ref[Any]", link: Link) -> None:
    """A Watch thread for the link's current session, and the report thread if none runs."""
    watcher = threading.Thread(target=_watch_loop, args=(ref, link, link.session),
                               name=f"vtalloc-watch-{link.session.session_id}", daemon=True)
    link.threads = [t for t in link.threads if t.is_alive()] + [watcher]
    watcher.start()
    if not any(t.name == _REPORT_THREAD and t.is_alive() for t in link.threads):
        reporter = threading.Thread(target=_report_loop, args=(ref, link), name=_REPORT_THREAD, daemon=True)
        link.threads.append(reporter)
        reporter.start()


def _watch_loop(ref: "weakref.ref[Any]", link: Link, session: ServiceSession) -> None:
    """Answer the daemon's events for one session until it ends or the space closes."""
    pause = WATCH_BACKOFF_S[0]
    while not link.stop.is_set() and link.session is session:
        try:
            call = session.watch(WATCH_RENEW_S)
        except VtallocError:
            return
        link.watch_call = call
        try:
            for event in call:
                pause = WATCH_BACKOFF_S[0]
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
            link.stop.wait(pause)  # closing the space ends the pause at once
            pause = min(pause * 2, WATCH_BACKOFF_S[1])
        finally:
            link.watch_call = None


def _answer_eviction(ref: "weakref.ref[Any]", request: Any) -> None:
    space = ref()
    if space is None or space.closed:
        return
    lease = space.page_source
    request_id = request.request_id

    def give_back(n: int) -> int:
        return lease.give_back(space, n, request_id) if n > 0 else 0

    try:
        returned = lease.evict_handler(space, request.pages, give_back)
        log.info("eviction request %d: %d of %d pages given back", request_id, returned, request.pages)
    except VtallocError as e:
        log.warning("eviction request %d failed: %s", request_id, e)


def _report_loop(ref: "weakref.ref[Any]", link: Link) -> None:
    while not link.stop.wait(_interval(ref)):
        space = ref()
        if space is None:
            return
        try:
            report = space.page_source.report(space)
            session = link.session
            del space
            session.call(session.pages, "Report", pages_pb2.ReportRequest(report=report))
        except (VtallocError, NotImplementedError):
            continue  # closed, or the daemon is away: report again next time


def _interval(ref: "weakref.ref[Any]") -> float:
    space = ref()
    source = None if space is None else space.page_source
    return 0.0 if source is None else source.report_interval_s  # 0: the loop sees the space gone at once
