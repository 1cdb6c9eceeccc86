"""What a client does when the daemon asks it to evict: the one seam to the eviction engine.

Owns: :func:`evict_for_pressure` (free pages for the daemon, in the give-back order: free and
cached pages first, then evictable allocations offloaded) and :func:`engine_counters`
(the eviction numbers a client reports). Both reach the eviction engine
(``AddressSpace.offload`` / ``residency``, and the ``Stats`` fields ``evicted_bytes``,
``pages_evicted``, ``evictions``, ``restores``) only through ``getattr``, so they take any
object that has them (tests use stand-ins) and, from one that lacks them, return only free
and cached pages and report zeros. Changing how pressure meets the engine means changing
this file only.

Invariant: nothing here drops live data: a page goes back to the daemon only when it holds
no live allocation, either because it was free or cached, or because the engine copied its
data to host memory first (offload keeps the allocation's address valid).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from vtalloc.allocator.errors import VtallocError

__all__ = ["evict_for_pressure", "engine_counters"]

log = logging.getLogger("vtalloc.client")

SETTLE_S = 1.0         # how long to wait for one offload's copy to reach the host
_POLL_S = 0.001        # how often to look while it copies


def evict_for_pressure(space: Any, pages: int, give_back: Callable[[int], int],
                       evictable: Iterable[int] = (), settle_s: float = SETTLE_S) -> int:
    """Give ``pages`` pages back to the daemon if possible; returns how many went back.

    ``give_back(n)`` returns up to ``n`` pages holding no live data (and tells the daemon);
    ``evictable`` lists the addresses the application marked evictable, least recently
    marked first. Free and cached pages go first; then, where the eviction engine exists,
    evictable allocations are offloaded to host memory one by one (waiting up to ``settle_s``
    for each copy) until enough pages are free.
    """
    returned = give_back(pages)
    offload = getattr(space, "offload", None)
    residency = getattr(space, "residency", None)
    if returned >= pages or offload is None or residency is None:
        return returned
    for address in list(evictable):
        try:
            if residency(address) != "resident":
                continue
            offload(address)  # asynchronous: the page is free once its bytes reached the host
            end = time.monotonic() + settle_s
            while residency(address) == "in_flight" and time.monotonic() < end:
                time.sleep(_POLL_S)
        except VtallocError as e:  # freed meanwhile, or the host pool is full: try the next one
            log.debug("could not offload %#x under pressure: %s", address, e)
            continue
        returned += give_back(pages - returned)
        if returned >= pages:
            break
    return returned


def engine_counters(stats: Any) -> dict[str, int]:
    """Eviction numbers for a report, from the engine's Stats fields (zeros where a build lacks them)."""
    return {
        "evicted_bytes": int(getattr(stats, "evicted_bytes", 0)),
        "evicted_pages": int(getattr(stats, "pages_evicted", 0)),
        "evictions_total": int(getattr(stats, "evictions", 0)),
        "restores_total": int(getattr(stats, "restores", 0)),
    }
