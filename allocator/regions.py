"""Regions: allocations made under a tag, paused and resumed together at the same addresses.

Owns: the Python face of the core's regions (docs/regions.md), mixed into
:class:`~vtalloc.allocator.address_space.AddressSpace` (which provides ``_lib``, ``_h()``,
``_source``): ``region(tag)``, the context in which a thread's allocations carry a tag;
``pause(tag, discard=...)``; ``resume(tag, timeout=...)``, with its rule for waiting; and
``regions()``; plus the process's tag ids (``tag_id``), interned by the core.
Invariants: a tag is checked before it crosses into C (1 to 64 letters, digits and
``. _ - : / @ +``, a letter or digit first); the tag in force is per thread and per space, and a
``region()`` block always restores the one before it, however it ends; a resume that fails
leaves the region paused (the core's resume is all or nothing), and only its last try counts an
out-of-memory (the ones before are tries, VTA_RESTORE_TRY), as a leased malloc's.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from typing import Any, Callable, Iterator

from . import _native
from .checks import space_name
from .errors import InvalidArgumentError, OutOfMemoryError
from .page_source import shortage_from_source
from .stats import RegionStats

__all__ = ["RegionCalls", "tag_id", "current_tag_id", "tagged", "resume_with_retries", "region_rows", "RESUME_RETRY_S"]

# While waiting for room to resume, tries are this far apart: the first, doubling to the last.
RESUME_RETRY_S = (0.01, 0.25)

_ids: dict[str, int] = {}
_ids_lock = threading.Lock()
_current = threading.local()  # by_space: {id(space): [tag id, ...]}, the innermost last


def tag_id(tag: str) -> int:
    """The process-wide id of ``tag`` (the core interns it once; at most 4096 tags)."""
    found = _ids.get(tag) if isinstance(tag, str) else None
    if found is not None:
        return found
    space_name(tag, "region tag")  # the same rule as the core's: a clear error before C
    out = ctypes.c_uint32()
    _native.check(_native.load().vta_region_tag(tag.encode(), ctypes.byref(out)))
    with _ids_lock:
        _ids[tag] = out.value
    return out.value


def current_tag_id(owner: object) -> int:
    """The tag id this thread's allocations in ``owner`` carry now (0: none)."""
    stacks = getattr(_current, "by_space", None)
    if not stacks:
        return 0
    stack = stacks.get(id(owner))
    return stack[-1] if stack else 0


@contextlib.contextmanager
def tagged(owner: object, tag: str) -> Iterator[str]:
    """While the block runs, this thread's allocations in ``owner`` carry ``tag``; nested blocks
    stack, and each restores the tag before it."""
    region = tag_id(tag)
    stacks = getattr(_current, "by_space", None)
    if stacks is None:
        stacks = _current.by_space = {}
    stack = stacks.setdefault(id(owner), [])
    stack.append(region)
    try:
        yield tag
    finally:
        stack.pop()
        if not stack:
            del stacks[id(owner)]


def resume_with_retries(tag: str, timeout: Any, attempt: Callable[[bool], int]) -> int:
    """``attempt(counted)`` until it finds room or ``timeout`` seconds passed: the tries before the
    last count no out-of-memory; the last one raises it, its message saying how long it waited."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise InvalidArgumentError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    deadline = time.monotonic() + timeout
    pause_s = RESUME_RETRY_S[0]
    while time.monotonic() + pause_s < deadline:
        try:
            return attempt(False)
        except OutOfMemoryError:
            time.sleep(pause_s)  # memory another thread (or, leased, the daemon) may free meanwhile
            pause_s = min(pause_s * 2, RESUME_RETRY_S[1])
    try:
        return attempt(True)
    except OutOfMemoryError as e:
        waited = f" after waiting {timeout:g} s" if timeout else ""
        raise OutOfMemoryError(f"resume({tag!r}) found no room{waited}; the region stays paused. {e}",
                               e.requested_bytes, e.capacity_bytes, e.mapped_bytes) from None


class RegionCalls:
    """The region calls of an address space (see the module's docstring)."""

    _lib: Any
    _source: Any

    def _h(self) -> int:  # provided by AddressSpace
        raise NotImplementedError

    def region(self, tag: str) -> contextlib.AbstractContextManager[str]:
        """``with space.region("weights"): ...``: allocations this thread makes in this space
        inside the block carry ``tag`` (tensors of :meth:`tensor` included). Blocks of a region
        share no page with blocks of another region, or of none, so a region's pages move whole."""
        return tagged(self, tag)

    def pause(self, tag: str, *, discard: bool = False) -> int:
        """Take the region's pages off the device, every allocation at once: their bytes are copied
        to the host pool (``discard=True``: kept nowhere, as for a KV cache), their device pages are
        released, and their addresses stay reserved. Until :meth:`resume`, reading, writing,
        restoring or offloading one of them raises :class:`PausedError` (and on the host backend a
        kernel touching one faults). Returns the device page bytes it freed; a leased space gives
        them back to its page source. :class:`HostPoolExhaustedError` (nothing moved) when the host
        pool cannot hold the region."""
        region = tag_id(tag)
        out = ctypes.c_uint64()
        flags = _native.PAUSE_DISCARD if discard else 0
        _native.check(self._lib.vta_region_pause(self._h(), region, flags, ctypes.byref(out)))
        if self._source is not None and out.value:
            self._source.after_pause(self, out.value)
        return out.value

    def resume(self, tag: str, *, timeout: float = 0.0) -> int:
        """Bring the region back at the same addresses (a discarded one's contents are undefined);
        returns the device page bytes it mapped. Device pages are taken as an allocation takes
        them: free and cached pages, pages offloaded allocations still hold, then allocations
        marked evictable are evicted (least recently used first); a leased space first leases from
        its page source (the daemon may ask other clients to give pages back). When that is not
        enough, it tries again until ``timeout`` seconds passed (0: not at all), then raises
        OutOfMemoryError: all or nothing, the region stays paused."""
        region = tag_id(tag)

        def attempt(counted: bool) -> int:
            out = ctypes.c_uint64()
            flags = 0 if counted else _native.RESTORE_TRY
            _native.check(self._lib.vta_region_resume(self._h(), region, flags, ctypes.byref(out)))
            return out.value

        source = self._source
        if source is None:
            return resume_with_retries(tag, timeout, attempt)
        source.check_usable()

        def leased(counted: bool) -> int:  # the page source answers a shortage before the last try
            return shortage_from_source(self, source, lambda: self.region_stats(tag).paused_page_bytes, attempt,
                                        last_counted=counted)

        return resume_with_retries(tag, timeout, leased)

    def regions(self) -> list[RegionStats]:
        """One record per tag this space has allocations of, or paused or resumed."""
        return region_rows(lambda rows, n, count: self._lib.vta_regions(self._h(), rows, n, count), _native.check)

    def region_stats(self, tag: str) -> RegionStats:
        """The record of ``tag`` (all zero when this space never saw it)."""
        space_name(tag, "region tag")
        for r in self.regions():
            if r.tag == tag:
                return r
        return RegionStats(tag, *([0] * (len(RegionStats.__dataclass_fields__) - 1)))


def region_rows(fetch: Callable[[Any, int, Any], int], check: Callable[[int], None]) -> list[RegionStats]:
    """The rows a ``vta_regions``-shaped call returns: ``fetch(rows, capacity, byref(count))``,
    asked for the count first, then again until what it returned fits."""
    count = ctypes.c_uint64()
    while True:
        check(fetch(None, 0, ctypes.byref(count)))
        n = count.value
        rows = (_native.VtaRegionInfo * max(n, 1))()
        check(fetch(rows, n, ctypes.byref(count)))
        if count.value <= n:
            return [_region_stats(r) for r in rows[: count.value]]


def _region_stats(raw: Any) -> RegionStats:
    values = {f: getattr(raw, f) for f in RegionStats.__dataclass_fields__ if f != "tag"}
    return RegionStats(tag=raw.tag.decode(), **values)
