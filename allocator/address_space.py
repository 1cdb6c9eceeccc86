"""AddressSpace: the Python face of one paged virtual address space.

Owns: one native ``vta_space`` handle and its lifetime (``close()`` is idempotent and
releases every page, mapping and reservation; the handle itself is freed when the object
is collected). Not copyable or picklable (NotCopyableError); in a forked child every method
raises ClosedError and close() releases nothing of the parent's (_handle.py). Every method
validates its arguments before crossing into C, so bad input raises a typed error and changes
nothing. No method holds the GIL while the core works.

A leased space (``leased=True``) holds no pages of its own: they are imported. With a
``page_source`` (allocator/page_source.py) it asks the source for pages when it runs short
and tells it about frees, trims and its close; without one the caller imports pages. A
shortage is reported by the core without counting an OOM (the tries are VTA_MALLOC_TRY /
VTA_RESTORE_TRY); the last try, the one given up on, counts the one OOM a caller sees, so the
core's num_ooms is the space's (nothing is counted in Python).
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
from typing import Any

from . import _native, backends
from .checks import MAX_U64 as _MAX_U64
from .checks import as_u64 as _as_u64
from .checks import plain_bytes as _plain_bytes
from .checks import space_name as _space_name
from ._handle import NativeHandle
from ._test_hooks import TestHooks
from .config import Config
from .errors import ClosedError, InvalidArgumentError, OutOfMemoryError
from .history import DEFAULT_MAX_ENTRIES, History
from .page_source import PageSource, malloc_from_source, restore_from_source
from .publish import publish_from_env
from .regions import RegionCalls, current_tag_id
from .stats import PAGE_STATES, AllocationRecord, PageRecord, Stats

__all__ = ["AddressSpace"]

_UNNAMED = itertools.count(1)  # numbers the unnamed spaces of this process, for their default names


class AddressSpace(RegionCalls, TestHooks, NativeHandle):
    """A paged virtual address space over fixed-size physical pages.

    >>> with AddressSpace(backend="host", capacity="64MiB") as space:
    ...     addr = space.malloc(4096)
    ...     space.write(addr, b"hello")
    ...     space.read(addr, 5)
    b'hello'
    """

    _CLOSE_FN, _DESTROY_FN = "vta_space_close", "vta_space_destroy"

    def __init__(
        self,
        backend: str = "auto",
        device: int = 0,
        capacity: int | str | None = None,
        page_size: int | str | None = None,
        *,
        small_threshold: int | str | None = None,
        host_granularity: int | str | None = None,
        host_capacity: int | str | None = None,
        reservation_size: int | str | None = None,
        evict_mode: str = "auto",
        cost_model: str | None = None,
        extent_size: int | str | None = None,
        config: Config | None = None,
        leased: bool = False,
        page_source: PageSource | None = None,
        service: str | None = None,
        name: str | None = None,
    ) -> None:
        """Build a space from its settings, normalized once into one Config (or ``config``,
        taken as it is). The environment is not read (``VTALLOC_*`` variables configure torch's
        allocator, whose spaces no caller builds): ``config=Config.from_env()`` reads it here. ``leased``: the space creates no pages; they are imported (by the
        caller, or by ``page_source``, which it then asks when short). ``service=`` is
        refused: :class:`vtalloc.client.ServiceAddressSpace` builds a service-backed space.
        ``name``: what ``vtalloc stats --pid`` and ``repr`` call it (checks.space_name); unnamed,
        ``<backend>:<device>#<n>``, the n-th unnamed space of the process (``"cuda:0#1"``)."""
        self._handle: int | None = None
        if name is not None:
            name = _space_name(name)
        self._closed = True
        self._source: PageSource | None = None
        self._history: History | None = None
        if service is not None:
            raise InvalidArgumentError(
                "AddressSpace(service=...) is gone: build a service-backed space with "
                "vtalloc.client.ServiceAddressSpace(address, ...)")
        if page_source is not None and not leased:
            raise InvalidArgumentError("a space with a page source is leased: pass leased=True")
        if config is None:
            config = Config(
                backend=backend, device=device, capacity=capacity, page_size=page_size,
                small_threshold=small_threshold, host_granularity=host_granularity,
                host_capacity=host_capacity, reservation_size=reservation_size, evict_mode=evict_mode,
                cost_model=cost_model, extent_size=extent_size,
            )
        self.config = config
        lib = _native.load()
        if leased and config.capacity is None:
            raise InvalidArgumentError("a leased address space needs a capacity (the most it may lease)")
        c = _native.make_config(config, flags=_native.CONFIG_LEASED if leased else 0)
        self.leased = leased
        handle = ctypes.c_void_p()
        _native.check(lib.vta_space_create(ctypes.byref(c), ctypes.byref(handle)))
        self._lib = lib
        self._own(handle.value)
        self._closed = False
        kind, dev = ctypes.c_int32(), ctypes.c_int32()
        _native.check(lib.vta_space_backend(self._handle, ctypes.byref(kind), ctypes.byref(dev)))
        self.backend: str = backends.name_of(kind.value)
        self.device: int = dev.value
        self.name: str = name if name is not None else f"{self.backend}:{self.device}#{next(_UNNAMED)}"
        s = self.stats()
        self.page_bytes: int = s.page_bytes
        self.capacity_bytes: int = s.capacity_bytes
        self.evict_mode: str = s.evict_mode  # the active mode: "mapped" or "copy"
        publish_from_env(self)  # VTALLOC_PUBLISH_STATS: stats for `vtalloc stats --pid`, off the hot path
        if page_source is not None:
            self._source = page_source  # first: what attach starts may look it up
            page_source.attach(self)

    @property
    def page_source(self) -> PageSource | None:
        """Where a leased space gets its pages (None: the space's own, or imported by the caller)."""
        return self._source

    # -- lifetime -------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release every page, mapping and reservation. Safe to call more than once."""
        if self._handle is None or self._closed:
            return
        self._closed = True
        if self._forked():
            # The pages, mappings, streams and session are the parent's (the child has copies of
            # its descriptors and shares its memory): closing them here would harm the parent,
            # and the core's stream threads do not exist in a child. The child forgets the handle.
            self._handle = None
            return
        source = self._source
        if source is not None:
            source.stop()
        deferred = False
        try:
            if getattr(self, "_live_tensors", 0):
                from .tensors import defer_close

                # Tensors over its pages live: the last one's finalizer closes it, and its page
                # source (a lease ends by revoking its pages: they must outlive the tensors).
                deferred = defer_close(self)
                if deferred:
                    return
            _native.check(self._lib.vta_space_close(self._handle))
        finally:
            if source is not None and not deferred:
                source.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"capacity={self.capacity_bytes}, page={self.page_bytes}"
        source = self._source.describe() if self._source is not None else ""
        return (f"<vtalloc AddressSpace {getattr(self, 'name', '?')!r} {getattr(self, 'backend', '?')}:"
                f"{getattr(self, 'device', '?')} {state}"
                + (f" {source}>" if source else ">"))

    def _h(self) -> int:
        if self._forked():
            raise ClosedError(f"this address space belongs to process {self._owner_pid}, which forked this one: "
                              "a forked child shares its pages and must not use it; create a new one after fork")
        if self._handle is None or self._closed:
            raise ClosedError("the address space is closed")
        return self._handle

    # -- allocation -----------------------------------------------------------------------
    def malloc(self, nbytes: int, stream: int = 0, *, evict: bool = True) -> int:
        """Allocate ``nbytes`` and return the address: 512-byte aligned, its size rounded up to
        512 bytes, on pages it may share with its neighbours (docs/design.md, "Blocks share pages").

        Under memory pressure, evictable pages are evicted (least recently used first) before
        an OutOfMemoryError; ``evict=False`` fails instead.
        """
        n = _as_u64(nbytes, "nbytes", positive=True)
        s = _as_u64(stream, "stream")
        history = self._history
        try:
            address = self._malloc_leased(n, s, evict) if self._source is not None else self._malloc(n, s, evict)
        except OutOfMemoryError as e:
            if history is not None:
                history.oom(n, max(0, e.capacity_bytes - e.mapped_bytes), s)
            raise
        if history is not None:
            history.alloc(address, n, s)
        return address

    def _malloc(self, n: int, s: int, evict: bool, counted: bool = True) -> int:
        """One malloc in the core; not ``counted``: a try, whose shortage is not an OOM (VTA_MALLOC_TRY)."""
        out = ctypes.c_uint64()
        flags = (0 if evict else _native.MALLOC_NO_EVICT) | (0 if counted else _native.MALLOC_TRY)
        region = current_tag_id(self)  # inside `with space.region(tag):` (allocator/regions.py)
        if region:
            status = self._lib.vta_malloc_region(self._h(), n, s, flags, region, ctypes.byref(out))
        elif flags:
            status = self._lib.vta_malloc_ex(self._h(), n, s, flags, ctypes.byref(out))
        else:
            status = self._lib.vta_malloc(self._h(), n, s, ctypes.byref(out))
        if status:
            _native.check(status)
        return out.value

    def _malloc_leased(self, n: int, s: int, evict: bool) -> int:
        """A shortage is answered by the page source first (page_source.malloc_from_source):
        the core reports it without counting an OOM; the try given up on counts one."""
        assert self._source is not None, "only a space with a page source leases"
        return malloc_from_source(self, self._source, n, evict,
                                  lambda may_evict, counted: self._malloc(n, s, may_evict, counted))

    def free(self, address: int) -> None:
        """Free an address returned by :meth:`malloc` (double, foreign or interior frees raise; so
        does the address of a live :meth:`tensor`'s storage: the tensor frees it when it dies)."""
        if getattr(self, "_live_tensors", 0):
            from .tensors import refuse_if_tensor_owned

            refuse_if_tensor_owned(self, address, "free")
        source = self._source
        if source is not None:
            source.check_usable()
        status = self._lib.vta_free(self._h(), _as_u64(address, "address"))
        if status:
            _native.check(status)
        if self._history is not None:
            self._history.free(address)
        if source is not None:
            source.after_free(self, address)

    def record_stream(self, address: int, stream: int) -> None:
        """PyTorch's ``Tensor.record_stream``: the allocation at ``address`` is also used on
        ``stream``; once freed, its memory is reused (even on its own stream) only after the
        work queued on ``stream`` up to the free completed."""
        _native.check(self._lib.vta_record_stream(self._h(), _as_u64(address, "address"), _as_u64(stream, "stream")))

    def size_of(self, address: int) -> int:
        """The size that was requested for the allocation at ``address``."""
        out = ctypes.c_uint64()
        _native.check(self._lib.vta_size_of(self._h(), _as_u64(address, "address"), ctypes.byref(out)))
        return out.value

    # -- bytes ----------------------------------------------------------------------------
    # read and write address the bytes [address + offset, + nbytes): ``address`` may be any
    # address inside a live allocation (its start, or an interior one: the start plus an
    # offset), and the whole range must lie inside that allocation's requested bytes. Every
    # other method takes the start address malloc returned.
    def _check_range(self, verb: str, addr: int, off: int, n: int) -> None:
        """Refuse an access that leaves its allocation before any buffer is made for it: the
        core checks the range's end with a zero-byte access (nothing copied, nothing allocated)."""
        end = off + n
        if end <= _MAX_U64 and not self._lib.vta_read(self._h(), addr, end, None, 0):
            return
        # A bad address says so (probed at offset 0: probing at ``off`` would report a far
        # offset as an access of 0 bytes, not of the n asked for).
        _native.check(self._lib.vta_read(self._h(), addr, 0, None, 0))
        raise InvalidArgumentError(
            f"{verb} of {n} bytes at offset {off} from {addr:#x} runs past the end of its allocation")

    def write(self, address: int, data: Any, offset: int = 0) -> None:
        """Copy ``data`` (any bytes-like object of plain data: bytes, bytearray, numeric arrays)
        into the allocation at ``address + offset``; a buffer of Python objects, pointers or
        structures is an InvalidArgumentError."""
        addr = _as_u64(address, "address")
        off = _as_u64(offset, "offset")
        view = _plain_bytes(data)  # refuses object arrays, pointers and structures (no raw pointers written)
        n = view.nbytes
        if n == 0:
            _native.check(self._lib.vta_write(self._h(), addr, off, None, 0))
            return
        if not isinstance(data, bytes):
            self._check_range("write", addr, off, n)  # before the data is copied
        keep: Any  # what ptr points into, alive until the call returns
        if isinstance(data, bytes):
            ptr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p)
            keep = data
        else:
            keep = (ctypes.c_ubyte * n).from_buffer_copy(view)
            ptr = ctypes.cast(keep, ctypes.c_void_p)
        _native.check(self._lib.vta_write(self._h(), addr, off, ptr, n))
        del keep

    def read(self, address: int, nbytes: int, offset: int = 0) -> bytes:
        """Return ``nbytes`` from the allocation at ``address + offset``."""
        addr = _as_u64(address, "address")
        n = _as_u64(nbytes, "nbytes")
        off = _as_u64(offset, "offset")
        self._check_range("read", addr, off, n)  # before the buffer is allocated
        buf = ctypes.create_string_buffer(max(n, 1))
        _native.check(self._lib.vta_read(self._h(), addr, off, buf, n))
        return buf.raw[:n]

    # -- maintenance ----------------------------------------------------------------------
    def trim(self) -> int:
        """Unmap cached free ranges, release the device pages offloaded allocations still hold,
        and give unmapped pages back; returns the bytes released. A space with a page source
        gives every page holding no live data back to the source instead."""
        if self._source is not None:
            self._source.check_usable()
            return self._source.trim(self)
        out = ctypes.c_uint64()
        _native.check(self._lib.vta_trim(self._h(), ctypes.byref(out)))
        return out.value

    def release_offloaded(self, wait: bool = False) -> int:
        """Unmap the device pages that offloaded allocations still hold (their bytes are safe on
        the host); returns the mapped bytes released. An offload keeps its device page until
        memory is needed, so a restore before then costs no copy; this ends that early, so the
        mapped bytes follow what is resident. One wait for the streams that may touch those pages
        (the same rule as :meth:`synchronize`); copies still in flight are not waited for and
        their pages stay held, unless ``wait``: then they are waited for first and released too.
        The pages stay in the space, free for the next allocation."""
        out = ctypes.c_uint64()
        _native.check(self._lib.vta_release_offloaded(self._h(), 1 if wait else 0, ctypes.byref(out)))
        return out.value

    def synchronize(self) -> None:
        """Wait for every pending free's stream and every copy in flight, so freed memory is
        reusable at once; then make the deferred mapping changes (offloaded pages give their
        device pages back, restored pages take their address), after waiting for the streams
        that may touch those pages (docs/eviction.md, "Ordering")."""
        _native.check(self._lib.vta_synchronize(self._h()))

    # -- eviction engine ------------------------------------------------------------------
    def set_evictable(self, address: int, flag: bool = True) -> None:
        """Let memory pressure evict this allocation's pages (or not: then it is made resident).

        A page shared by several allocations (small ones share pages) is evicted only if all
        of them are evictable. Evicted bytes keep their address and come back exact.
        """
        addr = _as_u64(address, "address")
        if not flag and self._source is not None:
            self._restore(addr, None, wait=True)  # with the source's pages: the core finds nothing left to restore
        _native.check(self._lib.vta_set_evictable(self._h(), addr, 1 if flag else 0))
        if self._source is not None:
            self._source.after_set_evictable(self, address, flag)

    def offload(self, address: int) -> int:
        """Start evicting the allocation's pages to host memory now (asynchronous); returns the
        bytes of the allocation now on pages that are away.

        Pages are shared between neighbouring allocations and move whole, so a page the
        allocation shares with an allocation not marked evictable stays resident (and its bytes
        are not counted); :class:`InvalidArgumentError` when that keeps every page of it.
        Do not write the allocation until :meth:`ensure_resident` returns.
        """
        moved = ctypes.c_uint64()
        _native.check(self._lib.vta_offload_bytes(self._h(), _as_u64(address, "address"), ctypes.byref(moved)))
        return moved.value

    def prefetch(self, address: int, stream: int | None = None) -> None:
        """Start restoring the allocation (asynchronous); ``stream`` (default: the
        allocation's) is ordered after the copies."""
        self._restore(address, stream, wait=False)

    def ensure_resident(self, address: int, stream: int | None = None) -> None:
        """Block until every page of the allocation is resident at its address."""
        self._restore(address, stream, wait=True)

    def _restore(self, address: int, stream: int | None, wait: bool) -> None:
        """A restore (prefetch; ``wait``: ensure_resident) in the core. With a page source, the
        source first adds what the restore lacks (the core would evict this space's own
        allocations to make room); a shortage, reported by a try that counts no OOM, asks it
        again before one last try, which counts the OOM the caller may see."""
        s, use = (0, 0) if stream is None else (_as_u64(stream, "stream"), 1)
        addr = _as_u64(address, "address")
        flags = _native.RESTORE_WAIT if wait else 0

        def restore(counted: bool) -> None:
            _native.check(self._lib.vta_restore(self._h(), addr, s, use, flags | (0 if counted else _native.RESTORE_TRY)))

        source = self._source
        if source is None:
            return restore(True)
        source.check_usable()
        source.before_restore(self, addr)
        restore_from_source(self, source, addr, restore)

    def residency(self, address: int) -> str:
        """``"resident"``, ``"evicted"`` (some page's bytes are in host memory) or ``"in_flight"``."""
        out = ctypes.c_int32()
        _native.check(self._lib.vta_residency(self._h(), _as_u64(address, "address"), ctypes.byref(out)))
        return _native.RESIDENCY_NAMES[out.value]

    # -- leased pages (the client side of the service) -------------------------------------
    def import_page(self, fd: int, tag: int) -> None:
        """Adopt a page received as file descriptor ``fd`` (still yours to close); ``tag`` names it
        (:meth:`return_pages` reports it), so a tag this space already holds is refused."""
        fd_ = _as_u64(fd, "fd")
        if fd_ >= 1 << 31:
            raise InvalidArgumentError(f"fd {fd_} is not a file descriptor")
        _native.check(self._lib.vta_space_import_page(self._h(), fd_, _as_u64(tag, "tag")))

    def return_pages(self, max_pages: int) -> list[int]:
        """Give back up to ``max_pages`` pages holding no live data; returns their tags."""
        # No space holds more pages than its capacity: that many tags at most, whatever is asked.
        n = min(_as_u64(max_pages, "max_pages"), self.capacity_bytes // self.page_bytes)
        tags = (ctypes.c_uint64 * max(n, 1))()
        count = ctypes.c_uint64()
        _native.check(self._lib.vta_space_return_pages(self._h(), n, tags, ctypes.byref(count)))
        return list(tags[: count.value])

    # -- inspection -----------------------------------------------------------------------
    def stats(self) -> Stats:
        raw = _native.VtaStats()
        _native.check(self._lib.vta_stats(self._h(), ctypes.byref(raw)))
        return _native.stats_from_struct(raw)

    def modeled_ns(self) -> int | None:
        """The cost model's modeled host clock (ns since the space was created): the time the
        calls made so far would have taken on the modeled GPU, waits for copies included
        (docs/cost-model.md). None when the space runs without a cost model."""
        enabled, ns = ctypes.c_int32(), ctypes.c_uint64()
        _native.check(self._lib.vta_space_modeled_ns(self._h(), ctypes.byref(enabled), ctypes.byref(ns)))
        return ns.value if enabled.value else None

    def reset_peak_stats(self) -> None:
        _native.check(self._lib.vta_reset_peak_stats(self._h()))

    def allocations(self) -> list[AllocationRecord]:
        rows = self._fetch(self._lib.vta_allocations, _native.VtaAllocInfo)
        return [AllocationRecord(r.address, r.size_bytes, r.requested_bytes, r.stream) for r in rows]

    def pages(self) -> list[PageRecord]:
        """One record per physical page held: where it is mapped, its state, the allocations on it."""
        rows = self._fetch(self._lib.vta_pages, _native.VtaPageInfo)
        allocs = self.allocations()
        starts = [a.address for a in allocs]
        out = []
        for r in rows:
            on_page: tuple[int, ...] = ()
            if r.address:
                end = r.address + self.page_bytes
                i = bisect.bisect_right(starts, r.address) - 1
                i = max(i, 0)
                on_page = tuple(
                    a.address for a in allocs[i:bisect.bisect_left(starts, end)]
                    if a.address < end and a.address + a.size_bytes > r.address
                )
            page_id = None if r.page_id == _native.NO_PAGE else r.page_id
            out.append(PageRecord(page_id, r.address or None, PAGE_STATES[r.state], on_page, r.tag or None))
        return out

    def memory_snapshot(self) -> dict[str, Any]:
        """This space in PyTorch's snapshot format (what ``torch.cuda.memory._snapshot()``
        returns), for ``torch.cuda._memory_viz`` (``stats``, ``segments``, ``memory``, the HTML
        plots and memory_viz's timeline): pickle it to a file. With :meth:`record_history` on,
        ``device_traces`` holds the recorded allocations and frees with their stacks. See
        allocator/memory_snapshot.py for the mapping."""
        from .memory_snapshot import space_snapshot

        return space_snapshot(self.allocations(), self.pages(), self.page_bytes, self.device, self._history)

    def record_history(self, enabled: bool = True, *, max_entries: int = DEFAULT_MAX_ENTRIES,
                       stacks: bool = True) -> None:
        """Record this space's allocations, frees and out-of-memory errors (at most ``max_entries``,
        the oldest dropped first; ``stacks``: with each call's Python stack) for
        :meth:`memory_snapshot`, as ``torch.cuda.memory._record_memory_history()`` does for
        torch's allocator. ``enabled=False`` stops recording and drops what was recorded."""
        self._h()
        self._history = History(max_entries, stacks=stacks) if enabled else None

    def summary(self) -> str:
        """A readable table of :meth:`stats`, as ``torch.cuda.memory_summary()`` prints torch's."""
        from .summary import space_summary

        return space_summary(self.stats(), repr(self))

    # -- torch ----------------------------------------------------------------------------
    def tensor(self, shape: Any, dtype: Any = None) -> Any:
        """A torch CPU tensor (uninitialized, float32 unless ``dtype``) whose storage is a new
        allocation of this host-backend space: no copy, freed back when its last view dies.
        Closing the space while such tensors live keeps their pages mapped until they die.
        See allocator/tensors.py."""
        from .tensors import space_tensor

        return space_tensor(self, shape, dtype)

    def _fetch(self, fn: Any, struct: Any) -> list[Any]:
        count = ctypes.c_uint64()
        while True:
            _native.check(fn(self._h(), None, 0, ctypes.byref(count)))
            n = count.value
            arr = (struct * max(n, 1))()
            _native.check(fn(self._h(), arr, n, ctypes.byref(count)))
            if count.value <= n:  # nothing was added between the two calls
                return list(arr[: count.value])
