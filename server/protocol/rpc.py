"""What every gRPC call of vtalloc.v1 carries, and the limits both ends hold to.

Owns: the session metadata key (and :func:`session_token`, reading it), the full names of the served services, the most pages one
Lease may ask for, the most page ids one Return or Report may carry and the most regions a Report
may list, and the node's
counter names (read from the ``Counters`` message of pages.proto, the one list of them).
Invariant: nothing here is a copy of the proto: names come from its descriptors.
"""

from __future__ import annotations

from vtalloc.server.proto.vtalloc.v1 import admin_pb2, pages_pb2

__all__ = ["SESSION_KEY", "session_token", "SERVICE_NAMES", "MAX_LEASE_PAGES", "MAX_RETURN_PAGES", "MAX_REPLY_BYTES", "MAX_REPORT_VALUE",
           "MAX_REPORT_REGIONS", "NODE_COUNTERS"]

SESSION_KEY = "x-vtalloc-session"          # metadata: the token the side channel gave the session
SERVICE_NAMES = (
    pages_pb2.DESCRIPTOR.services_by_name["Pages"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)
MAX_LEASE_PAGES = 4096                     # most pages one Lease may ask for
MAX_RETURN_PAGES = 65536                   # most page ids one Return or Report may carry
MAX_REPLY_BYTES = 64 << 20                 # largest answer (the page map of a large node)
# Largest value of one ClientReport field the daemon accepts (bytes or counts): 2**53, the
# largest integer a double holds exactly (rates, JSON readers and Prometheus samples are
# doubles), 8 PiB or 9e15 events, far above any real report. Larger is refused.
MAX_REPORT_VALUE = 1 << 53
# Most regions (tags) one ClientReport may list: a client with more reports its paused bytes in
# all, and the regions with the most paused bytes by name (client/lease.py).
MAX_REPORT_REGIONS = 64
NODE_COUNTERS: tuple[str, ...] = tuple(f.name for f in pages_pb2.Counters.DESCRIPTOR.fields)


def session_token(metadata) -> str | None:
    """The session token a call's metadata carries (the last one given), or None (none, or not text)."""
    token = None
    for key, value in metadata or ():
        if key == SESSION_KEY:
            token = value if isinstance(value, str) else None
    return token
