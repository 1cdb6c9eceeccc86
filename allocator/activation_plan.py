"""The activation planner: keep, page out or recompute each saved tensor under one byte budget.

Owns: the cost model of a saved activation (moving it over the copy link and back, or
recomputing it from what stays resident), the plan (one decision per pack index) and its
printable table and summary. Pure Python: no torch, so it is tested on plain numbers.

The plan, for the saved tensors of one recorded iteration (in pack order):

1. if they all fit in the budget, every one is kept (nothing moves, nothing is recomputed);
2. otherwise the bytes over the budget must leave: recompute the tensors that are cheaper to
   recompute than to move out and back, every run a step makes counted (with ``verify_at_pack``
   once at pack to check it reproduces the tensor, once at each unpack, and its recomputed
   sources again per run; verified bit-exact by the caller), fewest FLOPs per byte first, then
   cheapest in modelled time per byte, until the rest fits, within a cap on the FLOPs all
   recomputes run together (counted the same way);
3. what still does not fit is paged, oldest first (the first saved are the last backward
   reads): the newest tensors that fit in the budget are kept.

Invariants: kept bytes <= budget (what is recomputed holds no bytes; what is paged is resident
only while the pager's evict-behind lets it be); a tensor not marked recomputable is never
planned for recompute; a recompute whose sources are themselves recomputed counts their cost
too, and a chain deeper than ``MAX_CHAIN`` is not planned.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Callable, Sequence

__all__ = ["CostModel", "H100", "Candidate", "PlanRow", "PlanSummary", "Plan", "plan_activations", "MAX_CHAIN"]

KEEP, PAGE, RECOMPUTE, SHARED = "keep", "page", "recompute", "shared"
MAX_CHAIN = 4  # recomputes nested at most this deep (a recompute reading a recomputed tensor is one level)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds to move or recompute bytes on one device."""

    link_bytes_per_s: float      # copy link, each way
    peak_flops: float            # compute roofline
    mem_bytes_per_s: float       # memory roofline
    launch_s: float              # per operation recomputed
    name: str = ""

    def move_s(self, nbytes: int) -> float:
        """Out to host and back (the pager moves a paged tensor both ways): each way the bytes
        over the link and one operation issued (a copy, charged like a kernel launch)."""
        return 2 * (nbytes / self.link_bytes_per_s + self.launch_s)

    def recompute_s(self, flops: int, touched: int, ops: int = 1) -> float:
        return max(flops / self.peak_flops, touched / self.mem_bytes_per_s) + ops * self.launch_s


# H100 (80GB HBM3, SXM). Link: pinned cudaMemcpy at 256 MiB, 55.1 GB/s D2H / 54.8 H2D, measured
# 2026-11-22 (csrc/backend/testing/cost_model.cpp, docs/cost-model.md); the lower figure is used.
# Compute: 989 TFLOP/s dense bf16 (NVIDIA datasheet; fp32 work runs slower, but what is planned
# for recompute is memory-bound). Memory: 3.35 TB/s HBM3 (datasheet). Launch: ~5 us per kernel
# or copy issued from Python eager (an estimate, not measured here; a paged tensor issues one
# copy each way, as a recompute issues one kernel per operation).
H100 = CostModel(link_bytes_per_s=54.8e9, peak_flops=989e12, mem_bytes_per_s=3.35e12, launch_s=5e-6, name="h100")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One pack of the recorded iteration."""

    index: int                    # pack index
    nbytes: int                   # bytes it holds if kept (0: shared with an earlier pack, counted there)
    op: str                       # the operation that produced it ("" if unknown)
    recomputable: bool = False    # verified bit-exact from sources that stay available
    flops: int = 0                # of its own operations
    touched: int = 0              # bytes its own operations read and write
    ops: int = 1                  # operations its recompute runs (its own, not its sources')
    sources: tuple[int, ...] = ()  # pack indices of the saved tensors its recompute reads
    shared_with: int | None = None  # an earlier pack index of the same tensor (deduplicated)
    why: str = ""                 # not recomputable: why not (no recipe, not bit-exact, ...)


@dataclasses.dataclass(frozen=True)
class PlanRow:
    index: int
    nbytes: int
    op: str
    decision: str                 # keep | page | recompute | shared
    cost_s: float                 # modelled time it adds to a step (0 for keep)
    flops: int = 0                # recompute FLOPs of one run (with recomputed sources)
    why: str = ""                 # why it has no recipe ("" if it has one, or is shared)


@dataclasses.dataclass(frozen=True)
class PlanSummary:
    budget_bytes: int
    total_bytes: int
    kept_bytes: int
    paged_bytes: int
    recomputed_bytes: int
    recompute_flops: int          # at unpack; a tensor saved twice counted twice (each unpack may recompute it)
    transfer_s: float             # modelled: paged bytes out and back over the link
    recompute_s: float            # modelled: the recomputes
    cost_model: str
    verify_flops: int = 0         # at pack: each recompute run once more to check it (verify_at_pack)

    @property
    def modelled_s(self) -> float:
        """Time the plan adds to a step if no copy hid behind compute (an upper bound)."""
        return self.transfer_s + self.recompute_s


@dataclasses.dataclass(frozen=True)
class Plan:
    rows: tuple[PlanRow, ...]
    summary: PlanSummary

    def decision(self, index: int) -> str:
        return self.rows[index].decision if 0 <= index < len(self.rows) else PAGE

    def __str__(self) -> str:
        s = self.summary
        mib = 1 << 20
        lines = [f"{'#':>5} {'MiB':>9} {'decision':<9} {'cost us':>9} {'op'}"]
        for r in self.rows:
            lines.append(f"{r.index:>5} {r.nbytes / mib:>9.3f} {r.decision:<9} {r.cost_s * 1e6:>9.1f} {r.op}"
                         + (f"  (no recipe: {r.why})" if r.why else ""))
        lines.append(
            f"budget {s.budget_bytes / mib:.2f} MiB of {s.total_bytes / mib:.2f} MiB saved: kept {s.kept_bytes / mib:.2f}, "
            f"paged {s.paged_bytes / mib:.2f}, recomputed {s.recomputed_bytes / mib:.2f} MiB "
            f"({s.recompute_flops:,} FLOPs at unpack, {s.verify_flops:,} verifying at pack); "
            f"modelled on {s.cost_model}: {s.modelled_s * 1e3:.3f} ms "
            f"(transfer {s.transfer_s * 1e3:.3f}, recompute {s.recompute_s * 1e3:.3f}) per step, a prediction"
        )
        return "\n".join(lines)


def plan_activations(cands: Sequence[Candidate], budget: int, model: CostModel = H100, *,
                     allow_recompute: bool = True, max_recompute_flops: int | None = None,
                     verify_at_pack: bool = False) -> Plan:
    """One decision per candidate (see the module docstring). ``max_recompute_flops`` caps the
    FLOPs of all recomputes together (None: no cap); ``verify_at_pack``: each recompute also
    runs once at pack, its FLOPs and time counted too."""
    verify = 1 if verify_at_pack else 0
    by_index = {c.index: c for c in cands}
    total = sum(c.nbytes for c in cands)
    # A pack of no bytes that is not shared is one the pager could not take (no room): it is
    # offered to the pager again, as in the recorded iteration.
    decision = {c.index: (SHARED if c.shared_with is not None else KEEP if c.nbytes else PAGE) for c in cands}
    excess = total - budget
    # A tensor saved twice (shared) is unpacked twice; autograd may drop the first value before
    # the second unpack, which then recomputes again: its FLOPs count once per pack.
    uses = {c.index: 1 for c in cands}
    for c in cands:
        if c.shared_with is not None and c.shared_with in uses:
            uses[c.shared_with] += 1

    def chain(i: int) -> int:  # recompute nesting of i under the decisions so far
        c = by_index[i]
        return 1 + max((chain(s) for s in c.sources if decision.get(s) == RECOMPUTE), default=0)

    def rec_cost(i: int) -> tuple[float, int]:
        c = by_index[i]
        t, f = model.recompute_s(c.flops, c.touched, c.ops), c.flops
        for s in c.sources:
            if decision.get(s) == RECOMPUTE:
                st, sf = rec_cost(s)
                t, f = t + st, f + sf
        return t, f

    readers_of: dict[int, list[int]] = {}  # one entry per source a reader's recipe reads
    for d in cands:
        for src in d.sources:
            readers_of.setdefault(src, []).append(d.index)

    def runs(i: int, base: Callable[[int], int]) -> int:
        """Times i's own operations run per step: ``base(i)`` for its own pack, and once per run
        of each recomputed reader (a reader's recipe runs its recomputed sources again)."""
        return base(i) + sum(runs(r, base) for r in readers_of.get(i, ()) if decision[r] == RECOMPUTE)

    def unpack_runs(i: int) -> int:
        return uses[i]

    def verify_runs(i: int) -> int:
        return verify

    def all_runs(i: int) -> int:
        return uses[i] + verify

    def added(i: int) -> tuple[int, float]:
        """FLOPs and modelled seconds a step gains from recomputing i (just decided): its own
        operations at each of its runs, and its recomputed sources' (transitively) once more per
        run of i."""
        delta = {i: runs(i, all_runs)}
        heap, seen, flops, secs = [-i], set(), 0, 0.0
        while heap:  # readers before their sources: a source's pack index is the smaller
            j = -heapq.heappop(heap)
            if j in seen:
                continue
            seen.add(j)
            c = by_index[j]
            flops += c.flops * delta[j]
            secs += model.recompute_s(c.flops, c.touched, c.ops) * delta[j]
            for s in c.sources:
                if decision.get(s) == RECOMPUTE:
                    delta[s] = delta.get(s, 0) + delta[j]
                    heapq.heappush(heap, -s)
        return flops, secs

    def recomputed_readers(i: int) -> set[int]:
        """The recomputed tensors whose recipes run i's (directly or through other recomputes)."""
        found: set[int] = set()
        todo = [i]
        while todo:
            for r in readers_of.get(todo.pop(), ()):
                if decision[r] == RECOMPUTE and r not in found:
                    found.add(r)
                    todo.append(r)
        return found

    if excess > 0 and allow_recompute:
        cheap = [c for c in cands if c.recomputable and c.nbytes > 0 and c.shared_with is None
                 and model.recompute_s(c.flops, c.touched, c.ops) < model.move_s(c.nbytes)]
        # FLOPs are what the cap rations: the fewest per byte first (elementwise chains before the
        # matmuls under them), then the cheapest in modelled time.
        cheap.sort(key=lambda c: (c.flops / c.nbytes, model.recompute_s(c.flops, c.touched, c.ops) / c.nbytes,
                                  -c.nbytes, c.index))
        spent = 0
        for c in cheap:
            if excess <= 0:
                break
            decision[c.index] = RECOMPUTE
            more_flops, more_s = added(c.index)
            too_deep = chain(c.index) > MAX_CHAIN or any(chain(r) > MAX_CHAIN for r in recomputed_readers(c.index))
            # Every run counted (at pack to verify, at each unpack, its sources again) it must still
            # cost less than moving it out and back.
            dearer = more_s >= model.move_s(c.nbytes)
            if too_deep or dearer or (max_recompute_flops is not None and spent + more_flops > max_recompute_flops):
                decision[c.index] = KEEP
                continue
            spent += more_flops
            excess -= c.nbytes
    if excess > 0:  # page oldest first: the newest that fit stay
        for c in cands:
            if excess <= 0:
                break
            if decision[c.index] == KEEP and c.nbytes > 0:
                decision[c.index] = PAGE
                excess -= c.nbytes

    rows = []
    for c in cands:
        choice = decision[c.index]
        cost, flops = 0.0, 0
        if choice == PAGE:
            cost = model.move_s(c.nbytes)
        elif choice == RECOMPUTE:
            cost, flops = rec_cost(c.index)
            cost *= uses[c.index] + verify  # once per unpack of this pack, and once at pack to verify
        rows.append(PlanRow(c.index, c.nbytes, c.op, choice, cost, flops, why=c.why))
    recomputed = [c.index for c in cands if decision[c.index] == RECOMPUTE]
    summary = PlanSummary(
        budget_bytes=budget, total_bytes=total,
        kept_bytes=sum(r.nbytes for r in rows if r.decision == KEEP),
        paged_bytes=sum(r.nbytes for r in rows if r.decision == PAGE),
        recomputed_bytes=sum(r.nbytes for r in rows if r.decision == RECOMPUTE),
        recompute_flops=sum(by_index[i].flops * runs(i, unpack_runs) for i in recomputed),
        transfer_s=sum(r.cost_s for r in rows if r.decision == PAGE),
        recompute_s=sum(r.cost_s for r in rows if r.decision == RECOMPUTE),
        cost_model=model.name,
        verify_flops=sum(by_index[i].flops * runs(i, verify_runs) for i in recomputed))
    return Plan(tuple(rows), summary)
