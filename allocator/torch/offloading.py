"""Offload and prefetch of a torch tensor's pages, in place (same storage, same address).

Owns: ``offload`` and ``prefetch`` of a tensor: one made by ``space.tensor()`` (through its
AddressSpace) or a CUDA tensor under ``enable()`` (through the shim, on the tensor's device and
the current stream).
Invariants: never imports torch at import; anything else (a non-tensor, a CUDA tensor vtalloc
did not allocate) is an InvalidArgumentError and nothing moves.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError
from . import shim as _torch_shim
from .process_mode import GLOBAL
from .process_mode import import_torch as _torch
from .process_mode import state as _state

__all__ = ["offload", "prefetch"]


def _storage_of(tensor: Any) -> int:
    """The allocation behind a tensor: its storage's start."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    return tensor.untyped_storage().data_ptr()


def _residency(tensor: Any, space: Any, op: int, wait: bool = False) -> None:
    address = _storage_of(tensor)
    if space is not None:  # a tensor made by space.tensor()
        {_torch_shim.OP_OFFLOAD: space.offload,
         _torch_shim.OP_PREFETCH: space.ensure_resident if wait else space.prefetch}[op](address)
        return
    if not tensor.is_cuda or _state.mode != GLOBAL:
        raise InvalidArgumentError(
            "without a space, offload()/prefetch() take CUDA tensors allocated by vtalloc as torch's allocator "
            "(enable()); for tensors made by space.tensor(), pass the space"
        )
    device = tensor.device.index or 0
    if op == _torch_shim.OP_PREFETCH:
        stream = _torch().cuda.current_stream(device).cuda_stream
        _torch_shim.residency_op(device, _torch_shim.OP_ENSURE_RESIDENT if wait else op, address, stream)
    else:
        _torch_shim.residency_op(device, op, address)


def offload(tensor: Any, space: Any = None) -> None:
    """Start evicting ``tensor``'s pages to host memory, in place: same storage, same address.

    ``space``: the AddressSpace a ``space.tensor()`` lives in; ``None`` for a CUDA tensor under
    ``enable()``. Do not write the tensor until :func:`prefetch` (``wait=True``) brought it back.
    """
    _residency(tensor, space, _torch_shim.OP_OFFLOAD)


def prefetch(tensor: Any, space: Any = None, wait: bool = False) -> None:
    """Start restoring ``tensor``'s pages (``wait=True``: block until resident); on CUDA the
    current stream is ordered after the copies."""
    _residency(tensor, space, _torch_shim.OP_PREFETCH, wait)
