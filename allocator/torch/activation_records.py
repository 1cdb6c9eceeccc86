"""The records of ``paged_activations``: what autograd stores per saved tensor, and the counters.

Owns: the record (:class:`Saved`) the pack hook returns for one saved tensor (its kind: keep,
the tensor itself; page, the pager's handle and its residency; recompute, a bound and proven
recipe), the stand-in for a tensor the pager had no room for, and :class:`PagedStats`.
Invariants: a record's ``kind`` never changes after pack; ``state`` only moves forward to
``consumed`` (resident / offloaded / prefetched before that); a recompute record holds no bytes
of the tensor until its segment runs in backward, then (``cache``) only until its last unpack,
and after that a weak reference to the value its last unpack made.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["PagedStats", "Saved", "GONE"]


@dataclasses.dataclass(frozen=True)
class PagedStats:
    iterations: int            # forward passes run under the context
    scheduled_iterations: int  # of those, started on a recorded schedule
    fallback_iterations: int   # of those, left it: the packs (or the tensors unpacked) changed, re-recorded
    packed: int                # saved tensors handed to the pager
    packed_bytes: int
    passed_through: int        # saved tensors left as they are (parameters, tiny, other device, no room)
    passed_through_no_room: int  # of those, the pager had no room to take them (OutOfMemoryError at pack)
    offloads: int              # evictions started behind the forward pass
    releases: int              # times the device pages offloaded tensors still held were unmapped
    release_waits: int         # of those, times the copies in flight were waited for (forward ahead of the link)
    prefetches: int            # restores started ahead of the backward pass
    on_demand: int             # unpacks that found their tensor not resident and had to restore it
    unpack_wait_s: float       # time unpacks spent waiting for bytes
    budget_bytes: int
    reordered_iterations: int = 0  # of those, backward unpacked the same tensors in another order: plan kept, order learnt
    shared: int = 0            # packs of a tensor already packed (same tensor, same version): one record, no copy
    kept_bytes: int = 0        # bytes the plan kept resident as they are (no copy), all iterations
    bytes_paged: int = 0       # bytes the space moved over the copy link, out and back, all iterations (its counters)
    bytes_recomputed: int = 0  # bytes recomputed at unpack instead of held, all iterations
    recompute_flops: int = 0   # FLOPs those recomputes ran (their recipes' FLOPs, as recorded)
    recompute_fallbacks: int = 0  # planned recomputes paged instead (the recipe could not be bound or proven)
    recompute_diverged: int = 0  # of the fallbacks, recipes the trace check refused (the iteration ran otherwise)
    checked_ops: int = 0       # forward operations the trace check compared with the recorded ones
    replans: int = 0           # plans dropped because the first iteration after them ran otherwise
    host_pool_full: int = 0    # offloads refused by a full host pool: saved tensors stayed resident beyond the budget
    room_offloads: int = 0     # offloads made because the space had no room for a pack or a restore
    backward_held_bytes: int = 0  # most bytes of saved tensors a backward held at once, the one restored included
    step_kept_bytes: int = 0   # the same five for the latest iteration (its forward and backward so far)
    step_bytes_paged: int = 0
    step_bytes_recomputed: int = 0
    step_recompute_flops: int = 0
    step_checked_ops: int = 0
    step_peak_resident_bytes: int = 0  # the most saved bytes held at once in the latest iteration (kept,
    #                                    resident paged, segment values held), the pager's own count


def GONE() -> None:
    """Stands in the pack order for a tensor the pager had no room for (a dead weak reference)."""
    return None


class Saved:
    """What autograd stores for one packed tensor."""

    __slots__ = ("handle", "nbytes", "index", "iteration", "state", "kept", "kind", "version", "value", "cache",
                 "uses", "readers", "__weakref__")

    def __init__(self, handle: Any, nbytes: int, index: int, iteration: int, kind: str = "page",
                 version: int = 0) -> None:
        self.handle = handle        # page: the pager's; keep: the tensor; recompute: its Recipe (bound, verified)
        self.kind = kind            # page | keep | recompute
        self.version = version      # the tensor's _version when packed
        self.value: Any = None      # recompute: weak reference to the value last recomputed (a second unpack)
        self.cache: Any = None      # recompute: the value its segment's run made, held until its last unpack
        self.uses = 1               # recompute: unpacks still to come (the recorded iteration's count)
        self.readers = 0            # recompute: recomputed records still to read it (the plan's count)
        self.nbytes = nbytes
        self.index = index          # position in its iteration's pack order
        self.iteration = iteration
        self.state = "resident"     # resident | offloaded | prefetched | consumed
        self.kept = 0               # offloaded: its bytes still resident (pages shared with a pinned tensor)
