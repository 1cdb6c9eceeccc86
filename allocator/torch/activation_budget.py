"""The default budget of ``paged_activations``: what the cap leaves once the model's own memory is counted.

Owns: the meter (:class:`BudgetMeter`) that samples, during the recorded iteration (at every
pack and unpack), the bytes the pager's memory holds beyond the saved tensors the pager holds
resident (parameters, gradients as backward makes them, the batch, activations not saved,
workspace), and the budget that follows (:meth:`BudgetMeter.budget`).

budget = capacity - own - reserve, where own is the largest sample plus what the memory holds
more at the start of the next iteration than at the start of the recorded one (the optimizer's
state, made by its first step; gradients kept), and reserve is twice the largest saved tensor
(an operation's output and its workspace between two samples) plus, where the plan pages, what
offloaded pages may hold before the pager releases them (at most two quarter-budgets, and no
more than the bytes it pages). An explicit budget is never replaced.
Invariants: the budget is >= 1 byte; a pager that cannot say what its memory holds (no
``footprint``) leaves the provisional budget (half the capacity) in place.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["BudgetMeter"]


class BudgetMeter:
    """Samples one pager's memory in the recorded iteration (module docstring)."""

    def __init__(self, pager: Any, capacity: int) -> None:
        self._footprint = getattr(pager, "footprint", None)
        self.capacity = capacity
        self.own = 0          # largest bytes held beyond the pager's resident saved tensors
        self.start: int | None = None  # bytes held when the recorded iteration began
        self.largest = 0      # largest saved tensor
        self.samples = 0

    def _used(self) -> int | None:
        got = self._footprint() if self._footprint is not None else None
        return None if got is None else got[1]

    def begin(self) -> None:
        self.start = self._used()

    def sample(self, resident: int, nbytes: int = 0) -> None:
        self.largest = max(self.largest, nbytes)
        used = self._used()
        if used is not None:
            self.own = max(self.own, used - resident)
            self.samples += 1

    def settle(self, provisional: int, plan: Callable[[int], Any]) -> tuple[int, Any]:
        """The budget and its plan (``plan(budget)``): measured, and less what offloaded pages may
        hold where that plan pages; ``provisional`` where nothing was measured."""
        measured = self.budget()
        got = plan(measured or provisional)
        if measured and got.summary.paged_bytes:
            measured = self.budget(got.summary.paged_bytes) or measured
            got = plan(measured)
        return measured or provisional, got

    def budget(self, paged: int = 0) -> int | None:
        """The default budget, or None where nothing was measured."""
        now = self._used()
        if not self.samples or now is None or self.start is None:
            return None
        own = self.own + max(now - self.start, 0)
        budget = self.capacity - own - 2 * self.largest
        if paged:
            budget -= 2 * min(max(budget, 0) // 4, paged)
        return max(budget, 1)
