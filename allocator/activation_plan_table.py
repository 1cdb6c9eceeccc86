"""The activation plan as it is handed out: one row per pack index, a summary, the printed table.

Owns: the decisions' names, :class:`PlanRow`, :class:`PlanSummary` (what the plan keeps, pages
and recomputes, and what it is modelled to add to a step: a prediction) and :class:`Plan`
(rows and summary; ``str()`` prints them). Made by ``activation_plan.plan_activations``.
Invariants: frozen values; a pack index the plan has no row for is paged.
"""

from __future__ import annotations

import dataclasses

__all__ = ["KEEP", "PAGE", "RECOMPUTE", "SHARED", "PlanRow", "PlanSummary", "Plan"]

KEEP, PAGE, RECOMPUTE, SHARED = "keep", "page", "recompute", "shared"


@dataclasses.dataclass(frozen=True)
class PlanRow:
    index: int
    nbytes: int
    op: str
    decision: str                 # keep | page | recompute | shared
    cost_s: float                 # recompute: its run; page: its move with nothing hidden; keep: 0
    flops: int = 0                # recompute FLOPs of one run of its own operations
    why: str = ""                 # why it has no recipe ("" if it has one, or is shared)


@dataclasses.dataclass(frozen=True)
class PlanSummary:
    budget_bytes: int
    total_bytes: int
    kept_bytes: int
    paged_bytes: int
    recomputed_bytes: int
    recompute_flops: int          # per step: every recomputed tensor's own operations once (a group's once)
    transfer_s: float             # modelled: what the copy link stalls the step, after overlap
    recompute_s: float            # modelled: the recomputes
    cost_model: str
    check_s: float = 0.0          # modelled: host time of the copies issued and the trace check, not hidden
    peak_bytes: int = 0           # the plan's occupancy at its highest (forward end or a segment's run)
    segments: int = 0             # recomputed segments (tensors joined through their sources)
    largest_segment_bytes: int = 0
    run_budget_bytes: int = 0     # the family member chosen: its run budget (0: paging alone or nothing to do)
    plan_s: float = 0.0           # CPU time the planning took
    forward_s: float = 0.0        # modelled duration of the recorded forward (0: not recorded)
    forward_flops: int = 0        # the recorded forward's FLOPs, counted as recompute_flops is
    checked_ops: int = 0          # forward operations the trace check watches (in its windows)
    check_windows: int = 0        # windows it opens and closes at module boundaries

    @property
    def modelled_s(self) -> float:
        """Time the plan adds to a step on the cost model's device (a prediction)."""
        return self.transfer_s + self.recompute_s + self.check_s


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
            f"paged {s.paged_bytes / mib:.2f}, recomputed {s.recomputed_bytes / mib:.2f} MiB in {s.segments} segments "
            f"(largest {s.largest_segment_bytes / mib:.2f} MiB; {s.recompute_flops:,} FLOPs a step); planned peak "
            f"{s.peak_bytes / mib:.2f} MiB; modelled on {s.cost_model}: {s.modelled_s * 1e3:.3f} ms a step "
            f"(link stalls {s.transfer_s * 1e3:.3f}, recompute {s.recompute_s * 1e3:.3f}, host {s.check_s * 1e3:.3f}; "
            f"the trace check watches {s.checked_ops} operations in {s.check_windows} windows), "
            f"a prediction; planned in {s.plan_s * 1e3:.1f} ms")
        return "\n".join(lines)
