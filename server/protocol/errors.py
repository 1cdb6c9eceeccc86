"""The service's typed errors, and the one table between them and gRPC status codes, both ways.

Owns: the exception classes the service raises (all :class:`VtallocError`s, each also the
built-in a user would catch), the table from class to status code (:func:`status_for`, the
daemon's side) and :func:`error_from_rpc` (the client's side), which raises the same class
back: the daemon names it in trailing metadata (:data:`ERROR_KIND_KEY`), and only classes
of this table may be named; and :func:`echo`, how a message quotes what a request said.
Invariants: a status without a known class name still maps to a typed error (INTERNAL for
anything unexpected); a message quotes request fields only through :func:`echo`, so its
length does not grow with the request (gRPC carries it in trailing metadata, whose size is
limited: an unbounded echo turned the answer into RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import grpc

from vtalloc.allocator.checks import quote
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
    "LimitExceededError", "UntrustedRendezvousError", "status_for", "error_from_rpc",
    "error_by_name", "ERROR_KIND_KEY", "ECHO_CHARS", "echo",
]

# Trailing metadata naming the exception class, so a client raises exactly that class.
ERROR_KIND_KEY = "x-vtalloc-error"
ECHO_CHARS = 64  # the most characters of one request field an error message quotes


def echo(value: object) -> str:
    """``value`` for an error message: its repr if short, else its first :data:`ECHO_CHARS`
    characters and its length."""
    return quote(value, ECHO_CHARS)


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


class LimitExceededError(ServiceError, RuntimeError):
    """An operator's limit of the daemon refused this: sessions or pending connections per
    uid, a request's size, concurrent calls (the message names the limit; docs/service.md,
    "Limits"). The daemon keeps serving; try again once under the limit."""


class UntrustedRendezvousError(ServiceError, PermissionError):
    """The socket directory, a socket in it or the process serving it is not one this end
    trusts (another user could have put it there): nothing was sent or mapped. The message
    says what was found (owner, mode, uid); protocol/rendezvous.py makes the checks."""


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
    (LimitExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
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
              ServiceUnavailableError, QuotaExceededError, NodeShortError, OutOfMemoryError, LimitExceededError,
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
    grpc.StatusCode.RESOURCE_EXHAUSTED: LimitExceededError,  # gRPC's own: message too large, too many calls
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
}


def status_for(exc: BaseException) -> grpc.StatusCode:
    for cls, code in _STATUS_BY_CLASS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def error_by_name(kind: object, message: str) -> VtallocError:
    """The error a daemon named (a class of this table only; any other name: ServiceUnavailableError)."""
    cls = _CLASSES_BY_NAME.get(kind) if isinstance(kind, str) else None
    return (cls or ServiceUnavailableError)(message)


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
