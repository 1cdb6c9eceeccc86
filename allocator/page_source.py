"""PageSource: where a leased AddressSpace gets its pages, and where it gives them back.

Owns: the protocol between a leased address space (``AddressSpace(..., page_source=...)``)
and what supplies its pages. The space calls the source when it runs short (a malloc, a
restore of an evicted allocation, a region's resume), before a restore (so that its own
allocations are evicted only when the source has no more pages), after a free, after marking an
allocation evictable, after a region's pause, on trim and on close; the source imports pages into the space (``AddressSpace.import_page``)
and takes back pages holding no live data (``AddressSpace.return_pages``). The per-node
service's lease (vtalloc.client.service_space) is one; the allocator knows no other layer.
Also the order a leased malloc and a leased restore try things in (``malloc_from_source``,
``restore_from_source``): the core reports a shortage without counting an OOM, the source
answers it, and only the last try counts the OOM a caller sees.

Invariants:
- the allocator core decides which pages hold live data; a source only ever gets pages
  from ``return_pages``, so it cannot take a page out from under an allocation;
- a source holds its space weakly (``attach``), so it never keeps a closed space alive;
- ``close`` is called exactly once per space, after the space released its pages, even
  when building the space failed after the source was made (the builder closes it then).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, TypeVar

from .errors import OutOfMemoryError

__all__ = ["PageSource", "malloc_from_source", "restore_from_source", "shortage_from_source"]

T = TypeVar("T")

# A malloc short of pages asks the page source this many times (each time it may get pages
# another thread then takes) before it evicts or fails.
_SHORTAGE_RETRIES = 3


class PageSource(ABC):
    """What a leased AddressSpace calls; ``space`` is always that AddressSpace."""

    def attach(self, space: Any) -> None:
        """The space is built and empty: start serving it (hold it weakly)."""

    def check_usable(self) -> None:
        """Raise ClosedError if this process may not lease or give back (e.g. a forked child)."""

    @abstractmethod
    def on_shortage(self, space: Any, nbytes: int, *, restore: bool) -> bool:
        """The space could not place ``nbytes`` with the pages it holds: a new allocation, or
        (``restore``) bringing back an evicted allocation of that size. Add pages and return
        True for the space to try again; False when no more can come (the space re-raises
        its OutOfMemoryError); raise OutOfMemoryError when the supplier refuses."""

    def before_restore(self, space: Any, address: int) -> None:
        """The allocation at ``address`` is about to be restored (ensure_resident, prefetch):
        add the pages it needs if the space has too few spare, so that the core evicts the
        space's own allocations only when the supplier has no more. Never raises for a
        supplier's refusal (the restore then evicts, or fails, as without a source)."""

    @abstractmethod
    def after_free(self, space: Any, address: int) -> None:
        """``address`` was freed: give pages back if the space keeps too many unused."""

    def after_set_evictable(self, space: Any, address: int, flag: bool) -> None:
        """``address`` was marked evictable (``flag``) or not."""

    def after_pause(self, space: Any, page_bytes: int) -> None:
        """A region was paused (docs/regions.md): ``page_bytes`` of pages are unmapped in the space
        and hold nothing now; a supplier that others share takes them back here."""

    @abstractmethod
    def trim(self, space: Any) -> int:
        """Give back every page holding no live data; returns the bytes given back."""

    def stop(self) -> None:
        """The space is closing: stop background work that may touch it. Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """The space released its pages: end the supply. Idempotent."""

    def describe(self) -> str:
        """A few words for the space's repr (e.g. ``service=unix:///...``)."""
        return ""


def malloc_from_source(space: Any, source: PageSource, nbytes: int, evict: bool,
                       attempt: Callable[[bool, bool], int]) -> int:
    """A leased space's malloc: ``attempt(may_evict, counted)`` is one try in the core. The
    tries before the last are not ``counted``: the core reports their shortage (an
    OutOfMemoryError) without counting an OOM, and the page source answers it; evictable pages
    are evicted (if ``evict``) only when the source cannot supply enough, by the last try,
    which counts the one OOM the caller may see. Raises the last OutOfMemoryError before that
    try (a supplier's refusal says why best)."""
    source.check_usable()
    try:
        return attempt(False, False)
    except OutOfMemoryError as e:
        if nbytes > space.capacity_bytes:
            raise  # more than the space may ever hold: the core counted it (no page source helps)
        last: OutOfMemoryError = e
    for _ in range(_SHORTAGE_RETRIES):
        try:
            if not source.on_shortage(space, nbytes, restore=False):
                break
        except OutOfMemoryError as e:  # the supplier refused (a quota, the node short)
            last = e
            break
        try:
            return attempt(False, False)
        except OutOfMemoryError as e:
            last = e
    try:
        return attempt(evict, True)  # the supply cannot grow: evict what may be evicted; counted
    except OutOfMemoryError:
        raise last from None


def restore_from_source(space: Any, source: PageSource, address: int, restore: Callable[[bool], None]) -> None:
    """A leased space's restore of the allocation at ``address``: ``restore(counted)`` is one
    try in the core, as for :func:`malloc_from_source`: a shortage is reported without an OOM
    counted and answered by the page source, then one last, counted, try."""
    shortage_from_source(space, source, lambda: space.size_of(address), restore)


def shortage_from_source(space: Any, source: PageSource, nbytes: Callable[[], int], attempt: Callable[[bool], T], *,
                         last_counted: bool = True) -> T:
    """Bring back ``nbytes()`` bytes in a leased space (a restore, a region's resume):
    ``attempt(counted)`` is one try in the core; a shortage is reported without an OOM counted and
    answered by the page source (more pages, or none), then one last try, counted if
    ``last_counted``. A supplier's refusal is the error raised when the last try fails too."""
    try:
        return attempt(False)
    except OutOfMemoryError:
        pass  # a shortage: the source answers it
    refusal: OutOfMemoryError | None = None
    try:
        source.on_shortage(space, nbytes(), restore=True)  # more pages, or none: one last try
    except OutOfMemoryError as e:  # the supplier refused: its reason is the one to raise
        refusal = e
    try:
        return attempt(last_counted)
    except OutOfMemoryError:
        if refusal is not None:
            raise refusal from None
        raise
