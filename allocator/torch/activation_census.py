"""What one forward pass saves for backward, counted as ``paged_activations`` would take it.

Owns: :func:`saved_census`, which runs a forward under counting hooks (no pager, no space) and
returns a :class:`SavedCensus`: the bytes, the count and the largest of the saved tensors the
pager would take (not parameters or views of one, not under ``min_bytes``, a tensor saved twice
once), what it would leave alone, and the capacity a space needs to page them within a budget
(:meth:`SavedCensus.space_bytes`), so a budget and a space can be chosen without writing hooks.
Invariants: the forward runs once, with the random number generators' states restored after it
(the training that follows draws the same numbers); nothing it saved outlives the call.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .activation_pagers import DEFAULT_MIN_BYTES

__all__ = ["SavedCensus", "saved_census"]

DEFAULT_PAGE_BYTES = 2 << 20  # a CUDA page; a host-backend space's default too


@dataclasses.dataclass(frozen=True)
class SavedCensus:
    bytes: int               # saved bytes the pager would take (a tensor saved twice counted once)
    count: int               # saved tensors it would take
    largest: int             # bytes of the largest of them
    left_bytes: int          # saved bytes it would leave alone: parameters (or views of one), tensors under min_bytes
    left_count: int

    def space_bytes(self, budget: int, page_bytes: int = DEFAULT_PAGE_BYTES) -> int:
        """The capacity a space needs for the pager at ``budget`` (docs/eviction.md, "Sizing a space
        for the pager"): the budget, two quarter-budget slacks of offloaded pages not yet released,
        the largest tensor twice (the one being saved, and what backward holds at once besides the
        one it restores), and a page of rounding at each end of the resident run."""
        slack = max(budget // 4, 1)
        need = budget + 2 * slack + 2 * self.largest + 2 * page_bytes
        return -(-need // page_bytes) * page_bytes


def saved_census(fn: Callable[..., Any], *args: Any, min_bytes: int = DEFAULT_MIN_BYTES, **kwargs: Any) -> SavedCensus:
    """Run ``fn(*args, **kwargs)`` (one forward pass: ``lambda: loss_fn(model(x), y)``) and count
    what autograd saves for its backward. The graph is dropped; no backward runs. Like any
    forward in training mode it updates batch norm's running statistics::

        census = saved_census(lambda: loss_fn(model(x), y))
        budget = census.bytes // 4
        space = AddressSpace(backend="host", capacity=census.space_bytes(budget))
    """
    import torch

    seen: set[tuple[int, int]] = set()
    counts = dict(bytes=0, count=0, largest=0, left_bytes=0, left_count=0)

    def pack(t: Any) -> Any:
        base = t._base if t._base is not None else t
        nbytes = t.numel() * t.element_size()
        key = (id(t), t._version)
        if key in seen:
            return t
        seen.add(key)
        if (base.is_leaf and base.requires_grad) or nbytes < min_bytes:
            counts["left_bytes"] += nbytes
            counts["left_count"] += 1
        else:
            counts["bytes"] += nbytes
            counts["count"] += 1
            counts["largest"] = max(counts["largest"], nbytes)
        return t

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    del out
    return SavedCensus(**counts)
