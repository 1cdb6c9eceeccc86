"""Pagers: where the saved tensors ``paged_activations`` pages live, and how they move.

Owns: the :class:`Pager` interface the scheduler (``activation_paging``) drives with opaque
handles, and its two implementations. :class:`HostPager` (CPU training over a host-backend
space: a saved CPU tensor is copied into the space on pack, as ``save_on_cpu`` copies to host;
an expanded tensor, a stride of 0, is copied at the size of its storage) and
:class:`DevicePager` (CUDA training with vtalloc as torch's allocator, ``enable(evict_mode=
"mapped")``: the saved tensor's own allocation is paged in place: no copy, no new tensor, same
address). What crossed the link is read from the space's own counters (``moved_bytes``), never
estimated from the tensors' sizes.

Dense packing (HostPager): a copy is an allocation of exactly its bytes and stays *not
evictable* while resident, so the space places the copies of consecutive packs side by side
(its blocks keep off pages that evictable allocations hold, not off pinned ones) and small
saved tensors share pages instead of taking a page each. ``offload`` marks a copy evictable and
evicts it: a page it shares with a neighbour still resident stays (the neighbour is not
evictable), and moves with that neighbour's own offload. So a page crosses the link once, when
every copy on it has left, and the bytes moved are the bytes saved, not whole pages per tensor.

Invariants: ``unpack`` returns the bytes ``pack`` was given, as a fresh alias of them, and
leaves them not evictable; ``in_use`` is True while any tensor other than the pager's own
handle shares their storage (the alias autograd holds, a view a backward formula made), and
only a copy not in use is ever offloaded to make room; a pager never holds a tensor alive
beyond its handle.
"""

from __future__ import annotations

from typing import Any, Protocol

from . import process_mode as _torch_mode, shim as _torch_shim
from ..errors import InvalidArgumentError

__all__ = ["Pager", "HostPager", "DevicePager", "DEFAULT_MIN_BYTES"]

DEFAULT_MIN_BYTES = 1024  # smaller saved tensors are left as they are: paging them costs more than it saves


class Pager(Protocol):
    """Where saved tensors live. Handles are opaque to the scheduler."""

    def accepts(self, tensor: Any) -> bool: ...
    def pack(self, tensor: Any) -> tuple[Any, int]: ...          # -> (handle, bytes)
    def offload(self, handle: Any) -> int | None: ...           # -> bytes of it now away (None: all)
    def prefetch(self, handle: Any) -> None: ...
    def is_resident(self, handle: Any) -> bool: ...
    def unpack(self, handle: Any) -> Any: ...                   # waits; -> tensor (not evictable)
    def release(self, handle: Any) -> None: ...                 # after a borrow: back to how pack left it
    def in_use(self, handle: Any) -> bool: ...                  # a tensor besides the handle holds its bytes
    def value_changed(self, handle: Any, version: int) -> bool: ...  # written in place since it was packed
    def moved_bytes(self) -> int | None: ...                    # bytes the space copied out and back so far
    def room(self) -> dict[str, int]: ...                        # capacity, page, host pool: for messages
    # Optional: unmap the device pages offloaded tensors still hold; -> bytes released.
    def release_offloaded(self, wait: bool = False) -> int: ...
    # Optional: (capacity, bytes its memory holds now), for the default budget (activation_budget).
    def footprint(self) -> tuple[int, int] | None: ...


def _storage_span(tensor: Any) -> int:
    """Elements from a tensor's first to its last in storage (strides are never negative)."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride()))


def _storage_uses(tensor: Any) -> int:
    """Tensors (and storage objects) sharing ``tensor``'s storage, this call's own included."""
    import torch

    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))


def _alias(tensor: Any) -> Any:
    """A new tensor object over the same bytes, laid out the same (no copy)."""
    return tensor.as_strided(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())


class Held:
    """A pager's handle: the tensor whose bytes it pages, their allocation, and the storage's
    users when it was packed or last unpacked (``in_use`` compares against it)."""

    __slots__ = ("tensor", "address", "device", "uses")

    def __init__(self, tensor: Any, address: int, device: int = 0) -> None:
        self.tensor, self.address, self.device = tensor, address, device
        self.uses = _storage_uses(tensor)  # at pack: the pager's handle, and what the forward still holds

    def lend(self) -> Any:
        """The value autograd gets: a fresh alias, so ``in_use`` sees when it (and its views) died."""
        self.uses = _storage_uses(self.tensor)
        return _alias(self.tensor)

    def in_use(self) -> bool:
        return _storage_uses(self.tensor) > self.uses


def _moved(stats: Any) -> int:
    return int(stats.bytes_evicted_total + stats.bytes_restored_total)


class HostPager:
    """Saved CPU tensors copied into a host-backend :class:`AddressSpace`, packed densely, and
    paged there (module docstring)."""

    def __init__(self, space: Any, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        if space.backend != "host":
            raise InvalidArgumentError("HostPager needs a host-backend AddressSpace (CPU tensors)")
        self.space = space
        self.min_bytes = min_bytes

    def accepts(self, tensor: Any) -> bool:
        return tensor.device.type == "cpu" and tensor.numel() * tensor.element_size() >= self.min_bytes

    def pack(self, tensor: Any) -> tuple[Any, int]:
        src = tensor.detach()
        span = _storage_span(src)
        if span < src.numel():
            # Expanded or overlapping (a stride of 0): copy the elements its storage holds, not
            # its logical size (4 KiB broadcast to 256 MiB stays 4 KiB), and view them the same way.
            flat = self.space.tensor((span,), src.dtype)
            flat.copy_(src.as_strided((span,), (1,), src.storage_offset()))
            copy = flat.as_strided(tuple(src.shape), tuple(src.stride()), 0)
        elif span == src.numel() and not src.is_contiguous():
            # Dense but permuted (attention's output, a transpose): the same strides, so what
            # unpack returns is laid out as what was saved (a recipe may view it as the forward did).
            flat = self.space.tensor((span,), src.dtype)
            copy = flat.as_strided(tuple(src.shape), tuple(src.stride()), 0)
            copy.copy_(src)
        else:
            copy = self.space.tensor(tuple(src.shape), src.dtype)
            copy.copy_(src)
        # Not evictable while resident (module docstring: the next copy goes beside it).
        return Held(copy, copy.untyped_storage().data_ptr()), min(span, src.numel()) * copy.element_size()

    def offload(self, handle: Any) -> int:
        self.space.set_evictable(handle.address)
        return self.space.offload(handle.address)

    def prefetch(self, handle: Any) -> None:
        self.space.prefetch(handle.address)

    def is_resident(self, handle: Any) -> bool:
        return self.space.residency(handle.address) == "resident"

    def release_offloaded(self, wait: bool = False) -> int:
        return self.space.release_offloaded(wait)

    def footprint(self) -> tuple[int, int]:
        st = self.space.stats()
        return st.capacity_bytes, st.active_bytes - st.evicted_bytes

    def unpack(self, handle: Any) -> Any:
        # Resident (restored first if it was away), and not evictable: autograd holds the value now.
        self.space.set_evictable(handle.address, False)
        return handle.lend()

    def release(self, handle: Any) -> None:
        pass  # a resident copy is not evictable: nothing to give back after a borrow

    def in_use(self, handle: Any) -> bool:
        return handle.in_use()

    def value_changed(self, handle: Any, version: int) -> bool:
        return False  # the value is our copy: later in-place changes of the original do not reach it

    def moved_bytes(self) -> int | None:
        return None if self.space.closed else _moved(self.space.stats())

    def room(self) -> dict[str, int]:
        s = self.space.stats()
        return dict(capacity_bytes=s.capacity_bytes, page_bytes=s.page_bytes,
                    host_pool_capacity_bytes=s.host_pool_capacity_bytes, host_pool_used_bytes=s.host_pool_used_bytes)


class DevicePager:
    """Saved CUDA tensors paged in place in the spaces serving torch's allocator (``enable()``).

    Only in the "mapped" eviction mode: forward code may still hold a saved tensor (a
    residual connection, say) after it was offloaded, and in mapped mode such a read goes to
    the host copy, where in "copy" mode the unmapped address would fault the CUDA context.
    """

    def __init__(self, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        if _torch_mode.state.mode != _torch_mode.GLOBAL:
            raise InvalidArgumentError(
                "paged_activations() without a space pages torch's own CUDA tensors: call "
                "vtalloc.allocator.torch.enable() first (MemPool allocations are sub-allocated by torch and "
                "cannot be paged per tensor), or pass a host-backend AddressSpace for CPU training"
            )
        self._shim = _torch_shim
        self.min_bytes = min_bytes
        self._checked: set[int] = set()

    def _check_mode(self, device: int) -> None:
        if device in self._checked:
            return
        mode = self._shim.device_stats(device).evict_mode
        if mode != "mapped":
            raise _torch_mode.UnsupportedError(
                f"paging torch's CUDA activations in place needs evict_mode 'mapped' (host-located pages, "
                f"CUDA >= 12.2); device {device} runs '{mode}', where a tensor still read by the forward pass "
                "after being offloaded would fault. Use enable(evict_mode='mapped') on a driver that supports it"
            )
        self._checked.add(device)

    def accepts(self, tensor: Any) -> bool:
        return tensor.device.type == "cuda" and tensor.numel() * tensor.element_size() >= self.min_bytes

    def pack(self, tensor: Any) -> tuple[Any, int]:
        device = tensor.device.index or 0
        self._check_mode(device)
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        self._shim.residency_op(device, self._shim.OP_SET_EVICTABLE, address)
        return Held(tensor, address, device), storage.nbytes()

    def _stream(self, device: int) -> int:
        import torch

        return torch.cuda.current_stream(device).cuda_stream

    def offload(self, handle: Any) -> int:
        self._shim.residency_op(handle.device, self._shim.OP_SET_EVICTABLE, handle.address)
        return self._shim.offload_bytes(handle.device, handle.address)

    def prefetch(self, handle: Any) -> None:
        self._shim.residency_op(handle.device, self._shim.OP_PREFETCH, handle.address, self._stream(handle.device))

    def is_resident(self, handle: Any) -> bool:
        return self._shim.residency_op(handle.device, self._shim.OP_RESIDENCY, handle.address) == "resident"

    def release_offloaded(self, wait: bool = False) -> int:
        return self._shim.release_offloaded(wait=wait)

    def footprint(self) -> tuple[int, int] | None:
        devices = self._shim.devices()
        if not devices:
            return None
        st = self._shim.device_stats(min(self._checked, default=devices[0]))
        return st.capacity_bytes, st.active_bytes - st.evicted_bytes

    def unpack(self, handle: Any) -> Any:
        self._shim.residency_op(handle.device, self._shim.OP_ENSURE_RESIDENT, handle.address, self._stream(handle.device))
        # Not evictable any more: autograd holds the value now, and neither pressure nor the
        # offload of a neighbour sharing a page with it may move it.
        self._shim.residency_op(handle.device, self._shim.OP_CLEAR_EVICTABLE, handle.address)
        return handle.lend()

    def release(self, handle: Any) -> None:
        self._shim.residency_op(handle.device, self._shim.OP_SET_EVICTABLE, handle.address)

    def in_use(self, handle: Any) -> bool:
        return handle.in_use()

    def value_changed(self, handle: Any, version: int) -> bool:
        return handle.tensor._version != version  # paged in place: the value is the tensor itself

    def moved_bytes(self) -> int | None:
        return sum(_moved(self._shim.device_stats(d)) for d in self._shim.devices())

    def room(self) -> dict[str, int]:
        s = self._shim.device_stats(min(self._checked, default=0))
        return dict(capacity_bytes=s.capacity_bytes, page_bytes=s.page_bytes,
                    host_pool_capacity_bytes=s.host_pool_capacity_bytes, host_pool_used_bytes=s.host_pool_used_bytes)
