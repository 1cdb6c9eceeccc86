"""The options of paged activations, checked once into one typed value.

Owns: :class:`PagingOptions` and :func:`paging_options`: the budget (explicit, or measured from
the capacity in the recorded iteration, which runs with half of it meanwhile), ``recompute``
("auto" / "off") and the cap on recomputed FLOPs; and :class:`LinkCount`, what crossed the link
as the space's own counters say.
Invariants: a PagingOptions is valid once made (only :func:`paging_options` makes one, and it
raises InvalidArgumentError for anything else); nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from ..config import parse_size
from ..errors import InvalidArgumentError

__all__ = ["PagingOptions", "paging_options", "LinkCount"]


@dataclasses.dataclass(frozen=True)
class PagingOptions:
    budget: int                           # resident saved bytes (the recorded iteration's, when measured)
    measured: bool                        # the budget is measured from the capacity in the recorded iteration
    recompute: str                        # "auto": keep, page or recompute; "off": keep and page
    max_recompute_fraction: float | None  # cap on recomputed FLOPs, a share of the forward's (None: no cap)


def paging_options(budget: int | str | None, capacity_hint: int | None, recompute: str,
                   max_recompute_fraction: float | None) -> PagingOptions:
    if recompute not in ("auto", "off"):
        raise InvalidArgumentError(f"recompute must be 'auto' or 'off', not {recompute!r}")
    frac = max_recompute_fraction
    if frac is not None and (isinstance(frac, bool) or not isinstance(frac, (int, float)) or not math.isfinite(frac)
                             or frac < 0):
        raise InvalidArgumentError("max_recompute_fraction must be None or a finite number >= 0 (a share of "
                                   f"the forward's FLOPs), not {frac!r}")
    measured = budget is None
    if measured:
        if capacity_hint is None:
            raise InvalidArgumentError("give a budget (bytes of saved activations kept resident)")
        budget = max(capacity_hint // 2, 1)  # for the recorded iteration
    nbytes = parse_size(budget, name="budget")
    if capacity_hint is not None and nbytes > capacity_hint:
        raise InvalidArgumentError(
            f"budget {nbytes:,} bytes is above the capacity of {capacity_hint:,} bytes that holds the saved "
            "tensors: they could never all stay resident, and nothing would be left for the step's other "
            "memory; give a budget below the capacity (the default is half of it)")
    return PagingOptions(nbytes, measured, recompute, frac)


class LinkCount:
    """Bytes that crossed the link by the space's counters (``read``: None where the pager has
    none), since the pager was made and since the step began."""

    def __init__(self, read: Callable[[], int | None]) -> None:
        self._read = read
        self._start = self._step = self._last = read()

    def new_step(self) -> None:
        self._step = self.read()

    def read(self) -> int | None:
        now = self._read()
        if now is not None:
            self._last = now
        return self._last

    def since(self) -> tuple[int, int] | None:
        """(since the start, since the step began), or None where the pager counts nothing."""
        now = self.read()
        if now is None or self._start is None or self._step is None:
            return None
        return now - self._start, now - self._step
