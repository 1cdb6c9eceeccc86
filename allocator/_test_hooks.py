"""TestHooks: what tests reach in an address space that users never call.

Owns: fault injection, breaking the eviction engine's ordering rules on purpose, and the host
backend's test streams and kernels (docs/design.md, "Test kernels"), each a thin, validated
call into the core's ``vta_debug_*`` entry points (csrc/capi/testing/, over the address space's
test-facing wrapper, csrc/space/testing/). Mixed into :class:`AddressSpace`, which provides
``_lib`` and ``_h()``.
Invariants: every argument is checked before it crosses into C (a bad one is an
InvalidArgumentError); nothing here changes a space unless a test asked for it.
"""

from __future__ import annotations

import ctypes

from . import _native
from .checks import as_u64 as _as_u64
from .errors import InvalidArgumentError
from .stats import KernelCounters

__all__ = ["TestHooks"]


class TestHooks:
    """Tests only: the ``_``-prefixed debugging calls of an address space."""

    __test__ = False  # not a pytest test class
    _lib: ctypes.CDLL

    def _h(self) -> int:  # provided by AddressSpace
        raise NotImplementedError

    def _inject_fault(self, op: str, times: int = 1, *, skip: int = 0) -> None:
        """Tests only: let ``skip`` backend ``op`` calls pass, then make the next ``times`` fail
        ("copy", "map", ...; ``skip=n-1`` fails the nth call)."""
        if op not in _native.FAULT_OPS:
            raise InvalidArgumentError(f"unknown fault op {op!r}")
        _native.check(self._lib.vta_debug_inject_fault_after(self._h(), _native.FAULT_OPS[op], int(skip), int(times)))

    def _break_ordering(self, *rules: str) -> None:
        """Tests only: break ordering rules of the eviction engine ("quiesce": change mappings
        without waiting for the streams that may touch them; "copy_order": evict without waiting
        for the page's last use; "free_wait": reuse freed memory without waiting for its stream),
        so a stress test can show it catches the race. No rule given: the rules hold again."""
        unknown = [r for r in rules if r not in _native.ORDERING_RULES]
        if unknown:
            raise InvalidArgumentError(f"unknown ordering rule(s) {unknown}; known: {sorted(_native.ORDERING_RULES)}")
        mask = 0
        for r in rules:
            mask |= _native.ORDERING_RULES[r]
        _native.check(self._lib.vta_debug_break_ordering(self._h(), mask))

    def _victim_counters(self) -> tuple[int, int]:
        """Tests only: the eviction engine's victim candidates now (resident pages it may
        evict) and the entries its LRU touched since the space was created (one per page noted
        or forgotten, one per stored range a range forget cut): what a free cost there."""
        pages, touched = ctypes.c_uint64(), ctypes.c_uint64()
        _native.check(self._lib.vta_debug_victim_counters(self._h(), ctypes.byref(pages), ctypes.byref(touched)))
        return pages.value, touched.value

    # -- test kernels (host backend) -----------------------------------------------------------
    def _create_stream(self) -> int:
        """Tests only: a stream of this space's own, for :meth:`_run_kernel`; destroy it with
        :meth:`_destroy_stream` (closing the space destroys what is left)."""
        out = ctypes.c_uint64()
        _native.check(self._lib.vta_debug_stream_create(self._h(), ctypes.byref(out)))
        return out.value

    def _destroy_stream(self, stream: int) -> None:
        """Tests only: wait for the stream's work, then destroy it (refused while a live
        allocation was made on it)."""
        _native.check(self._lib.vta_debug_stream_destroy(self._h(), _as_u64(stream, "stream")))

    def _synchronize_stream(self, stream: int) -> None:
        """Tests only: wait until the stream's queued work (kernels included) has run.
        :meth:`synchronize` does not: it waits for pending frees and in-flight pages only."""
        _native.check(self._lib.vta_debug_stream_synchronize(self._h(), _as_u64(stream, "stream")))

    def _run_kernel(
        self, address: int, nbytes: int, *, stream: int, kind: str = "fill", seed: int = 0, duration_s: float = 0.0
    ) -> None:
        """Tests only (host backend): queue a test kernel on ``stream`` (0 or one of
        :meth:`_create_stream`) over ``[address, address + nbytes)``, inside one live allocation.

        ``"fill"`` writes a pattern derived from ``seed`` and each byte's index in the range;
        ``"check"`` counts the bytes that differ from it. Whole passes repeat for ``duration_s``
        (at least one). It runs later, on the stream, without the space's lock, like a GPU
        kernel; an access to an address unmapped meanwhile stops it and counts a fault
        (:meth:`_kernel_counters`). On stream 0 it runs now, on this thread.
        """
        if not isinstance(kind, str) or kind not in _native.KERNEL_KINDS:
            raise InvalidArgumentError(f"unknown kernel kind {kind!r}: expected one of {sorted(_native.KERNEL_KINDS)}")
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)):
            raise InvalidArgumentError(f"duration_s must be a number of seconds, not {type(duration_s).__name__}")
        if not 0.0 <= duration_s <= _native.MAX_KERNEL_SECONDS:  # NaN fails too
            raise InvalidArgumentError(
                f"duration_s must be between 0 and {_native.MAX_KERNEL_SECONDS:g} seconds, got {duration_s!r}"
            )
        args = (
            _as_u64(stream, "stream"), _as_u64(address, "address"), _as_u64(nbytes, "nbytes", positive=True),
            _native.KERNEL_KINDS[kind], _as_u64(seed, "seed"), round(duration_s * 1e9),
        )
        _native.check(self._lib.vta_debug_run_kernel(self._h(), *args))

    def _kernel_counters(self) -> KernelCounters:
        """Tests only (host backend): kernels launched, completed and faulted, copy faults, and
        the bytes CHECK kernels checked and found different, since the space was created."""
        raw = _native.VtaKernelCounters()
        _native.check(self._lib.vta_debug_kernel_counters(self._h(), ctypes.byref(raw)))
        return KernelCounters(**{f: getattr(raw, f) for f in KernelCounters.__dataclass_fields__})
