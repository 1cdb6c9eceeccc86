"""The backend registry, Python side: which backends the core knows and what each can do.

Owns: :class:`BackendInfo` and the readers of the core's registry (``vta_backends``,
csrc/backend/backend_registry.hpp): :func:`registered`, :func:`names`, :func:`choices` (the
names a ``backend=`` option takes), :func:`by_name`, :func:`code`, :func:`name_of`, and
:func:`auto_order` (the order "auto" tries them in).
Invariants: no backend is listed here: every name, code and capability is read from the library,
so a backend registered in the core (built in, or at run time by a test) is known here with no
edit; "auto" (code 0) is the choice rule, never a backend.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from . import _cabi
from ._library import load_with
from .errors import InvalidArgumentError

__all__ = ["AUTO", "BackendInfo", "registered", "names", "choices", "by_name", "code", "name_of", "auto_order"]

AUTO = "auto"
AUTO_CODE = 0
NAME_MAX = 32

# VTA_BACKEND_CAP_* (vtalloc.h), one bit per BackendCapabilities field (backend.hpp).
_CAPABILITY_BITS = {"device_memory": 1, "needs_context": 2, "can_capture": 4, "host_pages": 8,
                    "export_pages": 16, "test_kernels": 32}


class _VtaBackendInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("backend", ctypes.c_int32), ("capabilities", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32), ("name", ctypes.c_char * NAME_MAX)]


_PROTOTYPES: _cabi.Prototypes = {
    "vta_last_error": (ctypes.c_char_p, []),
    "vta_backends": (ctypes.c_int32, [ctypes.POINTER(_VtaBackendInfo), ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]),
}


@dataclass(frozen=True)
class BackendInfo:
    """One backend kind of the core's registry. The capabilities say what a backend of this kind
    may do; ``host_pages`` and ``export_pages`` also depend on the device (cuda)."""

    name: str
    code: int                # what the C ABI's ``backend`` fields take
    device_memory: bool      # its pages are GPU memory ("auto" prefers it; torch's "auto" takes no other)
    needs_context: bool      # its calls switch the thread's context (the torch shim restores it)
    can_capture: bool        # its streams may capture a CUDA graph
    host_pages: bool         # host-located pages: evict_mode="mapped"
    export_pages: bool       # pages shared as file descriptors (the service's leases)
    test_kernels: bool       # AddressSpace's test kernels

    def capabilities(self) -> list[str]:
        """The names of the capabilities it has, in the C ABI's bit order."""
        return [f for f in _CAPABILITY_BITS if getattr(self, f)]


def _lib() -> ctypes.CDLL:
    return load_with(_PROTOTYPES)


def registered() -> tuple[BackendInfo, ...]:
    """Every backend the core knows now, in code order (the built-ins first: host, cuda)."""
    lib = _lib()
    count = ctypes.c_uint64()
    _cabi.check(lib, lib.vta_backends(None, 0, ctypes.byref(count)))
    rows = (_VtaBackendInfo * count.value)()
    _cabi.check(lib, lib.vta_backends(rows, count.value, ctypes.byref(count)))
    return tuple(
        BackendInfo(r.name.decode(), r.backend, **{f: bool(r.capabilities & bit) for f, bit in _CAPABILITY_BITS.items()})
        for r in rows[: count.value]
    )


def names() -> tuple[str, ...]:
    """The registered backends' names, in code order."""
    return tuple(b.name for b in registered())


def choices() -> tuple[str, ...]:
    """What a ``backend=`` option takes: "auto", then every registered name."""
    return (AUTO, *names())


def by_name(name: str) -> BackendInfo:
    """The registered backend called ``name``; :class:`InvalidArgumentError` when none is."""
    for b in registered():
        if b.name == name:
            return b
    raise InvalidArgumentError(f"backend must be one of {', '.join(choices())}, got {name!r}")


def code(name: str) -> int:
    """The C ABI's code of ``name`` ("auto": 0)."""
    return AUTO_CODE if name == AUTO else by_name(name).code


def name_of(backend_code: int) -> str:
    """The name of a C ABI code (0: "auto")."""
    if backend_code == AUTO_CODE:
        return AUTO
    for b in registered():
        if b.code == backend_code:
            return b.name
    raise InvalidArgumentError(f"no backend has the code {backend_code}")


def auto_order() -> tuple[BackendInfo, ...]:
    """The registered backends in the order "auto" tries them: device memory first, then the
    others, each in code order (the core's rule, backend_registry.cpp)."""
    every = registered()
    return tuple(b for b in every if b.device_memory) + tuple(b for b in every if not b.device_memory)
