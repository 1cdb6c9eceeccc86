"""torch CPU tensors whose storage is an allocation of a host-backend address space (no copy).

Owns: making such tensors (``AddressSpace.tensor`` calls :func:`space_tensor`), the count of
live tensor storages per space, and giving each allocation back when the last tensor (or
view) over it dies. torch is imported inside functions only.

Invariants:
- a tensor's bytes are the space's bytes: ``data_ptr()`` lies inside the allocation and
  ``space.read(address, ...)`` sees what the tensor holds;
- the allocation is freed exactly once, when torch releases the storage (the buffer object
  torch keeps alive dies and its finalizer runs), never while any view of it lives;
- closing a space while tensors over it live never unmaps their pages: ``close()`` marks the
  space closed at once (every further call raises ClosedError) and the pages stay mapped
  until the last such tensor dies, whose finalizer then releases the space and, for a leased
  space, only then ends its lease (the daemon revokes the pages of an ended lease);
- an allocation a live tensor owns is the tensor's alone: ``free`` of its address is refused
  (:func:`refuse_if_tensor_owned`, an InvalidArgumentError), so nothing but the tensor's death
  frees its bytes (a free accepted there let the next malloc land under the tensor, whose
  finalizer then freed that allocation, and trim() unmapped it: SIGSEGV); eviction
  (``set_evictable``, ``offload``) stays allowed: the bytes come back at the same address;
- a finalizer never raises (it runs inside torch's deleter or at exit): failures are counted
  in :func:`release_failures`.
"""

from __future__ import annotations

import ctypes
import math
import operator
import threading
import weakref
from typing import Any

from . import _native
from .errors import ClosedError, InvalidArgumentError, VtallocError
from .extras import import_torch

__all__ = ["space_tensor", "live_tensor_storages", "release_failures", "defer_close", "refuse_if_tensor_owned"]

_lock = threading.Lock()
_failures: list[str] = []


def _shape(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, bool):
        raise InvalidArgumentError("shape must be an int or a sequence of ints, not a bool")
    if isinstance(shape, int) or hasattr(shape, "__index__"):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise InvalidArgumentError(f"shape must be an int or a sequence of ints, not {type(shape).__name__}") from None
    out = []
    for d in dims:
        if isinstance(d, bool):
            raise InvalidArgumentError("shape dimensions must be ints, not bools")
        try:
            n = operator.index(d)
        except TypeError:
            raise InvalidArgumentError(f"shape dimensions must be ints, got {d!r}") from None
        if n < 0:
            raise InvalidArgumentError(f"shape dimensions must be non-negative, got {n}")
        out.append(n)
    return tuple(out)


def space_tensor(space: Any, shape: Any, dtype: Any = None) -> Any:
    """A CPU tensor of ``shape`` and ``dtype`` (default float32) over a new allocation of ``space``.

    The contents are uninitialized, as with ``torch.empty``. A tensor with no elements still
    takes the smallest allocation, so its ``data_ptr()`` is an address of the space too.
    """
    torch = import_torch("space.tensor()")
    if dtype is None:
        dtype = torch.float32
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgumentError(f"dtype must be a torch.dtype, not {type(dtype).__name__}")
    if dtype in (torch.qint8, torch.quint8, torch.qint32, torch.quint4x2):
        raise InvalidArgumentError(f"quantized dtype {dtype} cannot be placed in an address space")
    dims = _shape(shape)
    if space.closed:
        raise ClosedError("the address space is closed")
    if space.backend != "host":
        raise InvalidArgumentError(
            f"space.tensor() makes CPU tensors, which need a host-backend space (this one is {space.backend}); "
            "for CUDA tensors use vtalloc.allocator.torch.enable() or mempool()"
        )
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(dims)
    nbytes = max(numel, 1) * itemsize
    address = space.malloc(nbytes)
    try:
        buffer = (ctypes.c_ubyte * nbytes).from_address(address)
        flat = torch.frombuffer(buffer, dtype=dtype, count=max(numel, 1))
        with _lock:
            space._live_tensors = getattr(space, "_live_tensors", 0) + 1
            owned = space.__dict__.setdefault("_tensor_owned", set())
            owned.add(address)
        # torch keeps `buffer` alive exactly as long as the storage: its death frees the allocation.
        weakref.finalize(buffer, _release, space, address)
    except BaseException:
        space.free(address)
        raise
    return flat[:numel].view(dims)


def _release(space: Any, address: int) -> None:
    with _lock:
        space._live_tensors -= 1
        space._tensor_owned.discard(address)
        last = space._live_tensors == 0
        closed = space.closed
        handle = space._handle
        if handle is None:  # the space object itself is gone (interpreter teardown): nothing to give back
            return
        lib = space._lib
        status = lib.vta_free(handle, address)
        try:
            _native.check(status)
            if space._history is not None:  # AddressSpace.record_history: the tensor's storage freed
                space._history.free(address)
        except ClosedError:
            pass  # closed natively meanwhile: its pages, this allocation's included, are released
        except VtallocError as e:
            _failures.append(f"free of tensor storage at {address:#x}: {e}")
        if closed and last:
            try:
                _native.check(lib.vta_space_close(handle))
            except VtallocError as e:
                _failures.append(f"deferred close of the address space: {e}")
            source = getattr(space, "_source", None)
        else:
            source = None
    if source is not None:  # a leased space's lease ends only now (outside the lock: it talks to the daemon)
        try:
            source.close()
        except Exception as e:  # noqa: BLE001 - a finalizer never raises
            with _lock:
                _failures.append(f"deferred close of the address space's page source: {e}")


def refuse_if_tensor_owned(space: Any, address: int, what: str) -> None:
    """InvalidArgumentError when a live tensor owns the allocation at ``address`` (``what``: the
    refused call): its bytes are the tensor's until the tensor dies, which frees them."""
    if type(address) is not int:
        return  # not an address at all: the call itself refuses it
    with _lock:
        owned = address in space.__dict__.get("_tensor_owned", ())
    if owned:
        raise InvalidArgumentError(
            f"{what} of {address:#x}: the allocation is the storage of a live tensor (space.tensor()); it is freed "
            "when the tensor and its views die: drop them (del) instead")


def defer_close(space: Any) -> bool:
    """Called by ``AddressSpace.close()`` after it marked the space closed: True when tensors over
    it live, and the last one's finalizer will release it; False when the caller closes it now."""
    with _lock:
        return getattr(space, "_live_tensors", 0) > 0


def live_tensor_storages(space: Any) -> int:
    """How many tensor storages over ``space`` are alive (each holds one allocation)."""
    with _lock:
        return getattr(space, "_live_tensors", 0)


def release_failures() -> list[str]:
    """Messages of frees or deferred closes that failed in a finalizer (expected: none)."""
    with _lock:
        return list(_failures)
