"""Is a backend usable here? Asked of the native core, never guessed.

``cuda_available()`` is True only when libcuda loads, a device exists and supports virtual
memory management. Any other failure than "unavailable" propagates: a probe that hides a
real error would let a GPU test skip instead of fail.
"""

from __future__ import annotations

from . import _native, backends
from .errors import BackendUnavailableError

__all__ = ["backend_available", "cuda_available"]


def backend_available(backend: str = "cuda", device: int = 0) -> tuple[bool, str]:
    """(usable, reason). The reason says why not, e.g. 'no CUDA driver: libcuda.so.1 ...'."""
    lib = _native.load()
    try:
        _native.check(lib.vta_backend_probe(backends.code(backend), device))
    except BackendUnavailableError as e:
        return False, str(e)
    return True, ""


def cuda_available(device: int = 0) -> bool:
    return backend_available("cuda", device)[0]
