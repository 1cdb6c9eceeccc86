"""ServiceAddressSpace: a leased AddressSpace and the lease that supplies its pages, held together.

``ServiceAddressSpace("unix:///run/vtalloc/vtalloc.sock", ...)`` opens a session, builds the
space's Config once from the arguments and the daemon's geometry, and builds a leased
AddressSpace over a :class:`~vtalloc.client.lease.LeaseSource` (its page source).
Owns: that construction, and the pair: it is a composition, not a subclass. It holds the
AddressSpace (:attr:`space`) and the lease, adds a few names for the lease (``session``,
``lease``, ``give_back``, ``report``, ``evictable_addresses``), and answers every other public
name of the AddressSpace API (``malloc``, ``stats``, ``tensor``, ..., and its test hooks) with the held space's.
The space asks the lease for pages when it runs short; the lease never sees this object.
Invariants: the held space lives exactly as long as this object (closing either closes the
space; the lease holds it only weakly); the lease's invariants are in lease.py: a page goes
back only when it holds no live data; pages of a daemon that restarted are kept, never
"returned" to the new one; the daemon down, mapped pages keep working and asking for more
raises ServiceUnavailableError at once; leases are serialized and giving back never waits
for one; background threads hold the space weakly and stop when it closes.
"""

from __future__ import annotations

from typing import Any, Callable

from vtalloc.allocator._handle import Unique
from vtalloc.allocator.address_space import AddressSpace
from vtalloc.allocator.checks import space_name
from vtalloc.allocator.config import Config
from vtalloc.allocator.errors import InvalidArgumentError
from vtalloc.server.proto.vtalloc.v1 import pages_pb2

from .lease import DEFAULT_LEASE_BATCH_PAGES, DEFAULT_REPORT_INTERVAL_S, EvictHandler, LeaseSource
from .pressure import evict_for_pressure
from .session import DEFAULT_RPC_TIMEOUT_S, ServiceSession

__all__ = ["ServiceAddressSpace", "EvictHandler", "default_evict_handler"]


def default_evict_handler(space: Any, pages: int, give_back: Callable[[int], int]) -> int:
    """Evict for a pressure request: ``space`` is the leased AddressSpace (its page source the lease)."""
    return evict_for_pressure(space, pages, give_back, space.page_source.evictable_addresses())


class ServiceAddressSpace(Unique):
    """A leased AddressSpace (:attr:`space`) whose page source is a lease from the daemon at
    ``address``; every public name of the AddressSpace API is answered by that space."""

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
            space = AddressSpace(config=lease.fit(config), leased=True, page_source=lease,
                                 name=f"session-{lease.hello.session_id}" if name is None else name)
        except BaseException:
            lease.close()
            raise
        self._space, self._lease = space, lease

    # -- the held space -------------------------------------------------------------------------
    @property
    def space(self) -> AddressSpace:
        """The leased AddressSpace this object holds (its page source is the lease)."""
        return self._space

    @property
    def page_source(self) -> LeaseSource:
        return self._lease

    def __getattr__(self, name: str) -> Any:
        # Only names normal lookup did not find: the held space's (its test hooks included, as
        # the fault campaigns use them); never a dunder name, which is this object's own business.
        space = self.__dict__.get("_space")
        if space is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(space, name)

    def __dir__(self) -> list[str]:
        space = self.__dict__.get("_space")
        names = set(super().__dir__())
        if space is not None:
            names.update(n for n in dir(space) if not (n.startswith("__") and n.endswith("__")))
        return sorted(names)

    def __enter__(self) -> "ServiceAddressSpace":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        space = self.__dict__.get("_space")
        return space is None or space.closed

    def close(self) -> None:
        """Close the space (its pages go back to the daemon) and end the session. Idempotent."""
        space = self.__dict__.get("_space")
        if space is not None:
            space.close()

    def __repr__(self) -> str:
        return repr(self.__dict__.get("_space")) if "_space" in self.__dict__ else "<vtalloc ServiceAddressSpace (not built)>"

    # -- the lease, by name ---------------------------------------------------------------------
    @property
    def session(self) -> ServiceSession:
        return self._lease.session

    @property
    def service_address(self) -> str:
        return self._lease.service_address

    def lease(self, pages: int) -> int:
        """Lease ``pages`` more pages from the daemon now (malloc does this by itself when it runs out)."""
        return self._lease.lease(self._space, pages)

    def give_back(self, max_pages: int, evict_request_id: int = 0) -> int:
        """Give back up to ``max_pages`` pages holding no live data to the daemon; returns how many."""
        return self._lease.give_back(self._space, max_pages, evict_request_id)

    def evictable_addresses(self) -> list[int]:
        """Allocations marked evictable, least recently marked first."""
        return self._lease.evictable_addresses()

    def report(self) -> pages_pb2.ClientReport:
        """This space's page counts as the daemon receives them."""
        return self._lease.report(self._space)
