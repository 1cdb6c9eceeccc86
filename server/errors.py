"""The service's errors, and the one place they become gRPC status codes and back.

Owns: the exception classes the service raises (all :class:`VtallocError`s, each also the
built-in a user would catch), the table from class to status code, the interceptor that
applies it to every vtalloc.v1 handler, and :func:`error_from_rpc`, which the client uses to
raise the same classes back. Invariants: no exception, and no undecodable request, leaves
a handler unmapped: an unexpected exception becomes INTERNAL (logged with its traceback),
and the daemon keeps serving. Handlers never build status codes themselves.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Awaitable, Callable

import grpc

from vtalloc.allocator.errors import (
    BackendUnavailableError,
    ClosedError,
    DriverError,
    HostPoolExhaustedError,
    InternalError,
    InvalidArgumentError,
    OutOfMemoryError,
    VtallocError,
)

__all__ = [
    "ServiceError", "UnauthenticatedError", "PermissionDeniedError", "NotFoundError",
    "FailedPreconditionError", "ServiceUnavailableError", "QuotaExceededError", "NodeShortError",
    "status_for", "error_from_rpc", "ErrorInterceptor", "ERROR_KIND_KEY",
]

log = logging.getLogger("vtalloc.server")

# Trailing metadata naming the exception class, so a client raises exactly that class.
ERROR_KIND_KEY = "x-vtalloc-error"


class ServiceError(VtallocError):
    """Base class of the errors only the service raises."""


class UnauthenticatedError(ServiceError, PermissionError):
    """The call carried no valid session token (open a session on the side channel first)."""


class PermissionDeniedError(ServiceError, PermissionError):
    """The session may not do this: another uid's pages or session, or an admin call."""


class NotFoundError(ServiceError, LookupError):
    """No such page, session or principal."""


class FailedPreconditionError(ServiceError, RuntimeError):
    """The request is valid but not in this state (an observer session asked for pages, ...)."""


class ServiceUnavailableError(ServiceError, ConnectionError):
    """The daemon cannot be reached, or went away; pages already mapped keep working."""


class QuotaExceededError(OutOfMemoryError):
    """The lease would take the principal past its hard maximum."""


class NodeShortError(OutOfMemoryError):
    """The node has no free page and other sessions did not free enough in time."""


# Most specific first: the first matching class decides the code.
_STATUS_BY_CLASS: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (NotFoundError, grpc.StatusCode.NOT_FOUND),
    (FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (ServiceUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (OutOfMemoryError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (HostPoolExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (ClosedError, grpc.StatusCode.FAILED_PRECONDITION),
    (BackendUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (DriverError, grpc.StatusCode.INTERNAL),
    (InternalError, grpc.StatusCode.INTERNAL),
)

# The classes a client may be told to raise by name (never an arbitrary name).
_CLASSES_BY_NAME: dict[str, type[VtallocError]] = {
    c.__name__: c
    for c in (UnauthenticatedError, PermissionDeniedError, NotFoundError, FailedPreconditionError,
              ServiceUnavailableError, QuotaExceededError, NodeShortError, OutOfMemoryError,
              HostPoolExhaustedError, InvalidArgumentError, ClosedError, BackendUnavailableError,
              DriverError, InternalError)
}

# What a client raises for a status without (a known) class name.
_CLASS_BY_STATUS: dict[grpc.StatusCode, type[VtallocError]] = {
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.UNAVAILABLE: ServiceUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: ServiceUnavailableError,
    grpc.StatusCode.CANCELLED: ServiceUnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: OutOfMemoryError,  # gRPC's own: message too large
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
}


def status_for(exc: BaseException) -> grpc.StatusCode:
    for cls, code in _STATUS_BY_CLASS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def error_from_rpc(err: grpc.RpcError, what: str) -> VtallocError:
    """The exception to raise for a failed call; ``what`` says which call, for the message."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    kind = ""
    trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == ERROR_KIND_KEY:
            kind = value if isinstance(value, str) else value.decode("ascii", "replace")
    cls = _CLASSES_BY_NAME.get(kind) or _CLASS_BY_STATUS.get(code, InternalError)
    message = f"{what}: {details}" if details else f"{what}: {code.name}"
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and cls is ServiceUnavailableError:
        message += " (the vtalloc daemon is not answering; pages already mapped keep working)"
    return cls(message)


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


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    code = status_for(exc)
    if code == grpc.StatusCode.INTERNAL and not isinstance(exc, VtallocError):
        log.error("%s failed unexpectedly", method, exc_info=exc)
        message = f"internal error in {method} ({type(exc).__name__}); the daemon logged it"
    else:
        message = str(exc)
    context.set_trailing_metadata(((ERROR_KIND_KEY, type(exc).__name__),))
    await context.abort(code, message)


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every vtalloc.v1 handler: undecodable requests and raised errors become status codes."""

    def __init__(self, prefix: str = "/vtalloc.v1.") -> None:
        self._prefix = prefix

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
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
                    await _abort(context, e, method)

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
                    await _abort(context, e, method)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=deserializer, response_serializer=handler.response_serializer)
        return handler
