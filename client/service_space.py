"""ServiceAddressSpace: build an AddressSpace whose physical pages are leased from the per-node daemon.

``ServiceAddressSpace("unix:///run/vtalloc/vtalloc.sock", ...)`` opens a session, builds the
space's Config once from the arguments and the daemon's geometry, and builds a leased
AddressSpace over a :class:`~vtalloc.client.lease.LeaseSource` (its page source). Owns only
that construction and a few names for the lease (``session``, ``lease``, ``give_back``,
``report``, ``evictable_addresses``); every other call is the core API, and the space asks
the lease for pages when it runs short. The lease's invariants are in lease.py: a page goes
back only when it holds no live data; pages of a daemon that restarted are kept, never
"returned" to the new one; the daemon down, mapped pages keep working and asking for more
raises ServiceUnavailableError at once; leases are serialized and giving back never waits
for one; background threads hold the space weakly and stop when it closes.
"""

from __future__ import annotations

from typing import Any, Callable

from vtalloc.allocator.address_space import AddressSpace
from vtalloc.allocator.checks import space_name
from vtalloc.allocator.config import Config
from vtalloc.allocator.errors import InvalidArgumentError
from vtalloc.server.proto.vtalloc.v1 import pages_pb2

from .lease import DEFAULT_LEASE_BATCH_PAGES, DEFAULT_REPORT_INTERVAL_S, EvictHandler, LeaseSource
from .pressure import evict_for_pressure
from .session import DEFAULT_RPC_TIMEOUT_S, ServiceSession

__all__ = ["ServiceAddressSpace", "EvictHandler", "default_evict_handler"]


def default_evict_handler(space: "ServiceAddressSpace", pages: int, give_back: Callable[[int], int]) -> int:
    return evict_for_pressure(space, pages, give_back, space.evictable_addresses())


class ServiceAddressSpace(AddressSpace):
    """A leased AddressSpace whose page source is a lease from the daemon at ``address``."""

    page_source: LeaseSource

    def __init__(
        self,
        address: str | None = None,
        *,
        config: Config | None = None,
        backend: str = "auto",
        device: int | None = None,
        capacity: int | str | None = None,
        page_size: int | str | None = None,
        leased: bool = True,
        lease_batch_pages: int = DEFAULT_LEASE_BATCH_PAGES,
        keep_free_pages: int | None = None,
        rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
        report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        evict_handler: EvictHandler | None = None,
        name: str | None = None,
        **options: Any,
    ) -> None:
        """Open a session with the daemon at ``address`` (default: the default socket) and a
        leased space over its pages.

        The daemon decides backend, device and page size (a different explicit value is an
        InvalidArgumentError); ``capacity`` caps this client below the node's capacity.
        ``config`` may say all of that at once (then ``options`` change it). Other keywords
        are Config fields (e.g. the eviction engine's ``host_capacity``, ``evict_mode``).
        ``lease_batch_pages``: pages leased at a time when malloc runs out; ``keep_free_pages``:
        unused pages kept after a free (default: one batch); ``evict_handler(space, pages,
        give_back)``: what to do when the daemon asks for pages (default: evict_for_pressure).
        ``name``: the space's name (default ``session-<session id>``, the id `vtalloc stats` shows).
        """
        if not leased:
            raise InvalidArgumentError("a service-backed address space is always leased")
        if name is not None:
            name = space_name(name)  # before a session opens
        lease = LeaseSource(address, evict_handler=evict_handler or default_evict_handler,
                            lease_batch_pages=lease_batch_pages, keep_free_pages=keep_free_pages,
                            rpc_timeout_s=rpc_timeout_s, report_interval_s=report_interval_s)
        try:
            if config is None:
                config = Config(backend=backend, device=lease.hello.device if device is None else device,
                                capacity=capacity, page_size=page_size, **options)
            elif options:
                config = config.replace(**options)
            super().__init__(config=lease.fit(config), leased=True, page_source=lease,
                             name=f"session-{lease.hello.session_id}" if name is None else name)
        except BaseException:
            lease.close()
            raise

    # -- the lease, by name ---------------------------------------------------------------------
    @property
    def session(self) -> ServiceSession:
        return self.page_source.session

    @property
    def service_address(self) -> str:
        return self.page_source.service_address

    def lease(self, pages: int) -> int:
        """Lease ``pages`` more pages from the daemon now (malloc does this by itself when it runs out)."""
        return self.page_source.lease(self, pages)

    def give_back(self, max_pages: int, evict_request_id: int = 0) -> int:
        """Give back up to ``max_pages`` pages holding no live data to the daemon; returns how many."""
        return self.page_source.give_back(self, max_pages, evict_request_id)

    def evictable_addresses(self) -> list[int]:
        """Allocations marked evictable, least recently marked first."""
        return self.page_source.evictable_addresses()

    def report(self) -> pages_pb2.ClientReport:
        """This space's page counts as the daemon receives them."""
        return self.page_source.report(self)
