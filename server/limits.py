"""The operator's limits on side-channel connections, and their per-uid accounting.

Owns: :class:`SessionLimits` (sessions per uid, pending connections per uid, the hello
timeout, gRPC calls per uid; validated here, built once from DaemonConfig), :class:`UidSlots`
(how many of each a uid holds now), :class:`RefusalLog` (one warning per uid and limit, then
at most one per REFUSAL_LOG_EVERY_S with the count since) and :class:`RpcLimiter`, the gRPC
interceptor that counts calls per caller before they count against the node's total
(Note [Calls per uid]). The side-channel refusal itself (a ``refused`` message naming
LimitExceededError, then the connection closes) is sent by node_connections.py.
Invariants: a slot is taken only if it is under its limit and vacated exactly once
(node_connections.py takes and vacates in one task's try/finally); the limits apply to every uid,
root and admins included: they count per uid, so one uid's sessions never use another's.
Under ``--principal-by pod`` a pod's connections count per pod instead (the key is
``pod:<uid>``, principals.py :func:`limit_key`): pods mostly share one uid (often root), and
one pod must not use up the slots of the others; a process outside any pod counts per uid.

Note [Paced session opens]
--------------------------
Opening a session costs the daemon's event loop work (credentials, pidfd, the hello, the
books, the answer, its end), and nothing bounded how often one uid did it: one uid's hellos
in a loop, each declaring a quota, tripled another user's lease latency. Each uid (pod) may
open SESSIONS_PER_S sessions per second after a burst of SESSIONS_BURST; past that its new
connections wait (holding their pending slot, so at most --max-pending-per-uid wait) until
their turn, before any work is done on them; one that would wait longer than the hello
timeout is refused with LimitExceededError. A waiting connection costs the loop a timer.

Note [Calls per uid]
--------------------
gRPC's own ``maximum_concurrent_rpcs`` counts a call as soon as its headers arrive, before
its caller is known, so one uid (with or without a session) could hold every slot and
everyone, root included, got RESOURCE_EXHAUSTED. The daemon does not use it. A call takes a
slot when its handler starts (its request has arrived): first one of its caller's
(``--max-rpcs-per-uid``; the caller is the uid of the session named by its token, which the
kernel gave on the side channel, or "no session" for every call without a live session, one
shared bucket), then one of the node's (``--max-concurrent-rpcs``), except for admin uids
(root, the daemon's, ``--admin-uid``), whose calls count only against their own uid: no other
uid can starve them. Both come back when the call ends, however it ends. Health's ``Check``
(answered from memory at once) counts against neither, so no flood of other calls makes the
daemon look down. A call over a limit ends with RESOURCE_EXHAUSTED naming
LimitExceededError and the limit. Calls are also paced by what they cost (the same callers: a
session's uid or pod, or "no session"): each call is charged its handler's own event-loop time,
the time gRPC took to decode its request and encode its replies, and gRPC's per-call cost, and a caller past its share of the loop waits for its turn (a timer,
no work, holding its slot) before its next handler runs (loop_share.py, Note [Loop share]).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Hashable

import grpc

from vtalloc.allocator.errors import InvalidArgumentError

from .errors import Continuation, abort
from .loop_share import CALL_COST_S, LOOP_SHARE, LoopShare, timed
from .protocol.errors import LimitExceededError, UnauthenticatedError
from .protocol.rpc import session_token

__all__ = ["SessionLimits", "UidSlots", "who", "RefusalLog", "REFUSAL_LOG_EVERY_S", "RpcSlots", "RpcLimiter",
           "NO_SESSION", "UNCOUNTED_METHODS", "RatePacer", "SESSIONS_PER_S", "SESSIONS_BURST"]

log = logging.getLogger("vtalloc.server")

REFUSAL_LOG_EVERY_S = 10.0
SESSIONS_PER_S = 100.0      # sessions one uid (pod) opens per second, after a burst of
SESSIONS_BURST = 100        # (Note [Paced session opens])
_HELLO_TIMEOUT_RANGE_S = (0.05, 60.0)   # shorter fails busy clients; longer lets idle ones hold a slot
_MAX_SLOTS = 1 << 20


@dataclass(frozen=True)
class SessionLimits:
    """Per uid: open sessions (client and observer both count), connections not yet past
    their hello, and how long a connection may take to say hello."""

    max_sessions_per_uid: int = 256
    max_pending_per_uid: int = 16
    hello_timeout_s: float = 2.0
    max_rpcs_per_uid: int = 512             # gRPC calls at once (Note [Calls per uid]); a session's
                                            # Watch is one, so above max_sessions_per_uid by default

    def __post_init__(self) -> None:
        for name in ("max_sessions_per_uid", "max_pending_per_uid", "max_rpcs_per_uid"):
            v = getattr(self, name)
            if type(v) is not int or not 1 <= v <= _MAX_SLOTS:
                raise InvalidArgumentError(f"{name} must be an integer 1 .. {_MAX_SLOTS}, got {v!r}")
        low, high = _HELLO_TIMEOUT_RANGE_S
        if not isinstance(self.hello_timeout_s, (int, float)) or not low <= self.hello_timeout_s <= high:
            raise InvalidArgumentError(f"hello timeout must be {low:g} .. {high:g} s, got {self.hello_timeout_s!r}")


def who(key: Hashable) -> str:
    """A limit's key in words: ``uid 1000`` for a uid, else the key (``pod:<uid>``)."""
    return f"uid {key}" if isinstance(key, int) else str(key)


class UidSlots:
    """How many slots of one kind each caller holds, under one limit. The caller's key is its
    uid, or under ``--principal-by pod`` its pod principal (principals.py :func:`limit_key`)."""

    def __init__(self, what: str, option: str, limit: int) -> None:
        self.what = what            # e.g. "open sessions"
        self.option = option        # the `vtalloc serve` option that sets the limit
        self.limit = limit
        self._held: collections.Counter[Hashable] = collections.Counter()

    def take(self, uid: Hashable) -> None:
        """Take a slot for ``uid`` (a key), or raise LimitExceededError naming the limit."""
        if self._held[uid] >= self.limit:
            raise LimitExceededError(
                f"{who(uid)} already has {self._held[uid]} {self.what} on this vtalloc daemon, its limit "
                f"({self.option} {self.limit}); close some, or ask the node's operator to raise it")
        self._held[uid] += 1

    def vacate(self, uid: Hashable) -> None:
        self._held[uid] -= 1
        if self._held[uid] <= 0:
            del self._held[uid]

    def held(self, uid: Hashable) -> int:
        return self._held[uid]


class RatePacer:
    """A token bucket per caller (Note [Paced session opens]): ``delay(key)`` takes one unit and
    says how long the caller waits before it may use it (0 within its rate and burst), or None
    when that would be longer than ``max_wait_s`` (then nothing is taken). Not thread-safe: the
    event loop's. Idle callers are forgotten, so it holds one entry per caller active lately."""

    def __init__(self, rate_per_s: float, burst: int, max_wait_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_wait_s, self._clock = rate_per_s, burst, max_wait_s, clock
        self._buckets: dict[Hashable, tuple[float, float]] = {}   # key -> (tokens, at)

    def delay(self, key: Hashable) -> float | None:
        now = self._clock()
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate) - 1.0
        wait = max(0.0, -tokens / self.rate)
        if wait > self.max_wait_s:
            return None
        self._buckets[key] = (tokens, now)
        if len(self._buckets) > 4096:       # forget callers whose buckets are full again
            full = [k for k, (t, a) in self._buckets.items() if t + (now - a) * self.rate >= self.burst]
            for k in full:
                del self._buckets[k]
        return wait


class RefusalLog:
    """Logs refusals: the first per (uid, limit), then at most one line per interval with the count."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[tuple[Hashable, str], tuple[float, int]] = {}  # -> (logged at, refused since)

    def refused(self, uid: Hashable, pid: int, slots: UidSlots, why: str, *, who: str | None = None) -> None:
        """``who``: what was refused (default: a side-channel connection from ``pid``, ``uid``)."""
        key = (uid, slots.option)
        now = self._clock()
        at, since = self._last.get(key, (None, 0))
        if at is None or now - at >= REFUSAL_LOG_EVERY_S:
            more = f" ({since} more refused since the last line)" if since else ""
            log.warning("%s refused: %s%s", who or f"side channel from pid {pid} uid {uid}", why, more)
            self._last[key] = (now, 0)
        else:
            self._last[key] = (at, since + 1)


NO_SESSION = -1   # the caller of every call without a live session (UidSlots key)
UNCOUNTED_METHODS = frozenset({"/grpc.health.v1.Health/Check"})


class RpcSlots:
    """Calls in progress per caller and in all (Note [Calls per uid]); not thread-safe: the event loop's."""

    def __init__(self, per_uid: int, total: int) -> None:
        self.per_uid = UidSlots("gRPC calls in progress", "--max-rpcs-per-uid", per_uid)
        self.total_limit = total
        self.total = 0                       # calls of non-admin callers

    def take(self, caller: Hashable, admin: bool) -> None:
        if caller == NO_SESSION and self.per_uid.held(caller) >= self.per_uid.limit:
            raise LimitExceededError(
                f"{self.per_uid.held(caller)} gRPC calls without a session are in progress on this vtalloc daemon, "
                f"their limit (--max-rpcs-per-uid {self.per_uid.limit}); try again later")
        self.per_uid.take(caller)
        if admin:
            return
        if self.total >= self.total_limit:
            self.per_uid.vacate(caller)
            raise LimitExceededError(
                f"{self.total} gRPC calls are in progress on this vtalloc daemon, its limit "
                f"(--max-concurrent-rpcs {self.total_limit}); try again later, or ask the node's operator to raise it")
        self.total += 1

    def vacate(self, caller: Hashable, admin: bool) -> None:
        self.per_uid.vacate(caller)
        if not admin:
            self.total -= 1


class RpcLimiter(grpc.aio.ServerInterceptor):
    """Takes a slot of :class:`RpcSlots` when a call's handler starts, vacates it when it ends."""

    def __init__(self, slots: RpcSlots, identify: Callable[[str | None], tuple[Hashable, bool]],
                 share: LoopShare | None = None) -> None:
        self.slots = slots
        self._identify = identify            # token -> (limit key: uid or pod, admin); raises UnauthenticatedError
        self._refusals = RefusalLog()
        self.share = share or LoopShare()    # each caller's share of the loop (loop_share.py)

    def _caller(self, metadata: Any) -> tuple[Hashable, bool]:
        token = session_token(metadata)
        if token is None:
            return NO_SESSION, False
        try:
            return self._identify(token)
        except UnauthenticatedError:
            return NO_SESSION, False

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method in UNCOUNTED_METHODS:
            return handler
        method, metadata, slots, share = details.method, details.invocation_metadata, self.slots, self.share
        payer = self._caller(metadata)[0]   # who pays for decoding its request (Note [Loop share])

        def charged(code: Callable[[Any], Any] | None) -> Callable[[Any], Any] | None:
            """``code`` (a request's decoder, a reply's encoder), its time on the loop charged to
            the caller: gRPC runs both on the event loop, outside any handler (decoding a 4 MiB
            Report: about 50 ms)."""
            if code is None:
                return None

            def run(data: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return code(data)
                finally:
                    share.charge(payer, time.perf_counter() - t0)
            return run

        async def enter(context: grpc.aio.ServicerContext) -> tuple[Hashable, bool]:
            """The caller's slots, or the call ends here (abort raises)."""
            caller, admin = self._caller(metadata)
            whose = "gRPC call without a session" if caller == NO_SESSION else f"gRPC call of {who(caller)}"
            wait = self.share.wait(caller)
            if wait is None:
                e = LimitExceededError(f"{whose} is past its share of the vtalloc daemon's time ({LOOP_SHARE:g} of "
                                       "each second); try again shortly")
                self._refusals.refused(caller, 0, slots.per_uid, f"{method}: {e}", who=whose)
                await abort(context, e, method)
            try:
                slots.take(caller, admin)
            except LimitExceededError as e:
                self._refusals.refused(caller, 0, slots.per_uid, f"{method}: {e}", who=whose)
                await abort(context, e, method)
            share.charge(caller, CALL_COST_S)   # gRPC's own work for the call (loop_share.py)
            if wait:
                try:
                    await asyncio.sleep(wait)   # its turn (Note [Calls per uid]): holding its slot, doing no work
                except BaseException:
                    slots.vacate(caller, admin)
                    raise
            return caller, admin

        def unary(inner: Callable) -> Callable:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                held = await enter(context)
                t0 = time.perf_counter()
                try:
                    result = inner(request, context)
                    if not hasattr(result, "__await__"):
                        return result
                    share.charge(held[0], time.perf_counter() - t0)
                    return await timed(result, lambda seconds: share.charge(held[0], seconds))
                finally:
                    slots.vacate(*held)
            return call

        def stream(inner: Callable) -> Callable:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                held = await enter(context)
                try:
                    result = inner(request, context)
                    if hasattr(result, "__aiter__"):
                        async for item in result:
                            yield item
                    elif hasattr(result, "__await__"):
                        await result  # a handler that writes with context.write
                    else:
                        for item in result:
                            yield item
                finally:
                    slots.vacate(*held)
            return call

        for kind, wrap, make in (("unary_unary", unary, grpc.unary_unary_rpc_method_handler),
                                 ("stream_unary", unary, grpc.stream_unary_rpc_method_handler),
                                 ("unary_stream", stream, grpc.unary_stream_rpc_method_handler),
                                 ("stream_stream", stream, grpc.stream_stream_rpc_method_handler)):
            inner = getattr(handler, kind)
            if inner is not None:
                return make(wrap(inner), request_deserializer=charged(handler.request_deserializer),
                            response_serializer=charged(handler.response_serializer))
        return handler
