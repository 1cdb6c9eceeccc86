"""The daemon's side of errors: every vtalloc.v1 handler's exception becomes a status code.

Owns: the interceptor that applies vtalloc.server.protocol.errors' table to every
vtalloc.v1 handler (the classes and the table live there, shared with the client; they are
importable from here too). Invariants: no exception, and no undecodable request, leaves a
handler unmapped: an unexpected exception becomes INTERNAL (logged with its traceback), and
the daemon keeps serving; no status message is longer than MAX_STATUS_CHARS (it travels in
trailing metadata, whose size gRPC limits; messages quote request fields through
protocol.errors.echo, and this is the last bound). Handlers never build status codes themselves.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from vtalloc.allocator.errors import InvalidArgumentError, VtallocError

from .protocol.errors import (
    ERROR_KIND_KEY,
    FailedPreconditionError,
    LimitExceededError,
    NodeShortError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    ServiceError,
    ServiceUnavailableError,
    UnauthenticatedError,
    error_from_rpc,
    status_for,
)

__all__ = [
    "ServiceError", "UnauthenticatedError", "PermissionDeniedError", "NotFoundError",
    "FailedPreconditionError", "ServiceUnavailableError", "QuotaExceededError", "NodeShortError",
    "LimitExceededError", "status_for", "error_from_rpc", "ErrorInterceptor", "ERROR_KIND_KEY", "abort",
    "Continuation",
]

log = logging.getLogger("vtalloc.server")
# What a server interceptor's intercept_service gets to find the next handler.
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]
MAX_STATUS_CHARS = 1024  # the longest status message sent (gRPC's metadata limit is 8-16 KiB)


class _Undecodable:
    """Stands in for a request whose bytes did not parse, so the handler can say INVALID_ARGUMENT."""

    def __init__(self, why: str) -> None:
        self.why = why


def _safe_deserializer(inner: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if inner is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return inner(data)
        except Exception as e:  # noqa: BLE001 - any parse failure is the caller's bad input
            return _Undecodable(f"{type(e).__name__}: {e}")

    return deserialize


async def abort(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    """End the call with ``exc``'s status code and class name (ERROR_KIND_KEY)."""
    code = status_for(exc)
    if code == grpc.StatusCode.INTERNAL and not isinstance(exc, VtallocError):
        log.error("%s failed unexpectedly", method, exc_info=exc)
        message = f"internal error in {method} ({type(exc).__name__}); the daemon logged it"
    else:
        message = str(exc)
    if len(message) > MAX_STATUS_CHARS:
        message = f"{message[:MAX_STATUS_CHARS]}... ({len(message)} characters)"
    context.set_trailing_metadata(((ERROR_KIND_KEY, type(exc).__name__),))
    await context.abort(code, message)


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every vtalloc.v1 handler: undecodable requests and raised errors become status codes."""

    def __init__(self, prefix: str = "/vtalloc.v1.") -> None:
        self._prefix = prefix

    async def intercept_service(self, continuation: Continuation,
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(self._prefix):
            return handler
        method = details.method
        deserializer = _safe_deserializer(handler.request_deserializer)
        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    if isinstance(request, _Undecodable):
                        raise InvalidArgumentError(f"undecodable request: {request.why}")
                    return await inner_uu(request, context)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as e:  # noqa: BLE001 - every error is mapped, none crashes the daemon
                    await abort(context, e, method)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=deserializer, response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                try:
                    if isinstance(request, _Undecodable):
                        raise InvalidArgumentError(f"undecodable request: {request.why}")
                    async for item in inner_us(request, context):
                        yield item
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as e:  # noqa: BLE001
                    await abort(context, e, method)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=deserializer, response_serializer=handler.response_serializer)
        return handler
