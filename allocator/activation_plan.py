"""The activation planner: keep, page out or recompute each saved tensor under one byte budget.

Owns: the plan (one decision per pack index of the recorded iteration) and how it is chosen
(its printable table and summary: ``activation_plan_table``). Pure Python: no torch (the prices
are ``activation_costs``).

A recomputed tensor is rebuilt at unpack from its recipe, which reads the nearest saved
tensors (its *sources*). A source that is recomputed too is rebuilt in the same run: the
recomputed tensors joined through their sources form a *segment*, run once, at the first
unpack of any of them in backward, each member held from then until backward consumes it
(so a block whose saved tensors are all recomputed from its kept input is what per-block
checkpointing does). Every recomputed tensor's own operations run once per step.

What the plan holds at each moment (its *occupancy*, in saved bytes, as the pager counts them:
a tensor unpacked for the last time is autograd's, no longer the pager's): a kept tensor from
its pack to its last unpack; a paged one from where a recomputed reader brings it back early
to its last unpack; a recomputed one from the run of its segment that builds it to its last
unpack. The budget bounds the occupancy at the end of the forward and after every unpack.

How it is chosen (docs/activation-plan.md, "How the plan is chosen"): a small family of plans,
each built in linear time and priced whole; the cheapest whose occupancy holds the budget wins:
paging alone, and per *run budget* R of a grid: cuts (kept tensors placed by dynamic programming
so no recomputed stretch holds more than R), repair, fill (keep the dearest to recompute per
byte where there is room), hidden paging (what the link hides, while cheaper); then the cheapest
few again with hidden paging priced on the trace check's windows and the paged tensors that
stall the link recomputed where cheaper (``activation_costs.check_windows``: the check watches
only the module boundaries around the recomputed tensors' recipes).

Invariants: a tensor not marked recomputable is never recomputed; the chosen plan's occupancy
is within the budget (or, if no plan is, the page-only plan is chosen); recomputed FLOPs stay
under ``max_recompute_flops``; shared rows (a tensor packed twice) follow their first pack.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import time
from typing import Sequence

from .activation_costs import H100, CostModel, Forward, check_windows, host_added_s, paging_stall_s
from .activation_plan_table import KEEP, PAGE, RECOMPUTE, SHARED, Plan, PlanRow, PlanSummary

__all__ = ["CostModel", "H100", "Forward", "Candidate", "PlanRow", "PlanSummary", "Plan", "plan_activations",
           "KEEP", "PAGE", "RECOMPUTE", "SHARED"]

RUN_BUDGET_STEPS = 12  # run budgets tried, from the budget down by factors of sqrt(2)
UNSTALL_MEMBERS = 3    # the cheapest members tried again with what their paging stalls recomputed


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One pack of the recorded iteration."""

    index: int                    # pack index
    nbytes: int                   # bytes it holds if kept (0: shared with an earlier pack, counted there)
    op: str                       # the operation that produced it ("" if unknown)
    recomputable: bool = False    # a recipe verified bit-exact, from sources that stay available
    flops: int = 0                # of its own operations
    touched: int = 0              # bytes its own operations read and write
    ops: int = 1                  # operations its recipe runs (its own, not its sources')
    sources: tuple[int, ...] = ()  # pack indices of the saved tensors its recipe reads
    shared_with: int | None = None  # an earlier pack index of the same tensor (deduplicated)
    why: str = ""                 # not recomputable: why not (no recipe, not bit-exact, ...)
    at_s: float = 0.0             # modelled time into the forward when it was packed
    at_op: int = 0                # operations of the forward run when it was packed
    group: int = -1               # the operation its recipe ends in (its position): recomputed tensors of
    #                               one group are rebuilt in one run of it (other outputs of one call)
    span: tuple[int, int] | None = None  # first and last forward positions the trace check must watch to
    #                               prove its recipe (None: not known, the whole forward)


class _Planner:
    """The family of plans over one recorded iteration (module docstring)."""

    def __init__(self, cands: Sequence[Candidate], budget: int, model: CostModel, fwd: Forward,
                 unpack_order: Sequence[int] | None, max_flops: int | None) -> None:
        self.cands, self.budget, self.model, self.fwd, self.max_flops = cands, budget, model, fwd, max_flops
        self.by_index = {c.index: c for c in cands}
        self.prim = [c.index for c in cands if c.nbytes > 0 and c.shared_with is None]
        self.b = {i: self.by_index[i].nbytes for i in self.prim}
        self.r = {i: model.run_s(c.flops, c.touched, c.ops) for i in self.prim for c in [self.by_index[i]]}
        self.can = {i for i in self.prim if self.by_index[i].recomputable
                    and all(s in self.b for s in self.by_index[i].sources)}
        self.readers: dict[int, list[int]] = collections.defaultdict(list)
        for i in self.can:
            for s in set(self.by_index[i].sources):
                self.readers[s].append(i)
        order = list(unpack_order) if unpack_order else [c.index for c in reversed(cands)]
        self.points = len(order) + 2  # 0: the forward's end; u + 1: unpack u; last: never unpacked
        never = self.points - 1
        self.first_use = dict.fromkeys(self.prim, never)
        self.last_use = dict.fromkeys(self.prim, never)
        for u, i in enumerate(order):
            j = self.by_index[i].shared_with if i in self.by_index and self.by_index[i].shared_with is not None else i
            if j in self.first_use:
                self.first_use[j] = min(self.first_use[j], u + 1) if self.first_use[j] != never else u + 1
                self.last_use[j] = u + 1
        # backward time of each point (mirror of the forward), non-decreasing
        clock, bf = fwd.clock_s, model.backward_factor
        self.tau = [0.0] * self.points
        for u, i in enumerate(order):
            at = self.by_index[i].at_s if i in self.by_index else 0.0
            self.tau[u + 1] = max(self.tau[u], bf * (clock - at))
        self.tau[-1] = max(self.tau[-2], bf * clock)
        self.rank = {i: k for k, i in enumerate(self.prim)}
        self.group = {i: self.by_index[i].group for i in self.can}

    # -- evaluation --------------------------------------------------------------------------
    def firsts(self, dec: dict[int, str]) -> dict[int, int]:
        """Point from which each tensor is held: kept from the forward's end; paged or recomputed
        from its first use, or from the run of a recomputed reader that needs it earlier, or of
        a recomputed one of its group (rebuilt together)."""
        first = self._firsts(dec, {})
        early: dict[int, int] = {}
        for i in self.prim:
            g = self.group.get(i, -1)
            if g >= 0 and dec[i] == RECOMPUTE:
                early[g] = min(early.get(g, first[i]), first[i])
        return self._firsts(dec, early) if early else first

    def _firsts(self, dec: dict[int, str], early: dict[int, int]) -> dict[int, int]:
        first: dict[int, int] = {}
        for i in reversed(self.prim):
            if dec[i] == KEEP:
                first[i] = 0
                continue
            f = self.first_use[i]
            if dec[i] == RECOMPUTE:
                f = min(f, early.get(self.group.get(i, -1), f))
            for r in self.readers.get(i, ()):
                if dec[r] == RECOMPUTE:
                    f = min(f, first[r])
            first[i] = f
        return first

    def rebuilt(self, dec: dict[int, str], what: dict[int, float]) -> float:
        """``what`` (seconds or FLOPs per tensor) of the recomputed tensors, once per group."""
        total, groups = 0.0, {}  # type: float, dict[int, float]
        for i in self.prim:
            if dec[i] == RECOMPUTE:
                g = self.group.get(i, -1)
                if g < 0:
                    total += what[i]
                else:
                    groups[g] = max(groups.get(g, 0), what[i])
        return total + sum(groups.values())

    def occupancy(self, dec: dict[int, str], first: dict[int, int]) -> list[int]:
        diff = [0] * (self.points + 1)
        for i in self.prim:
            end = self.last_use[i]
            if dec[i] == RECOMPUTE:  # held too until its recomputed readers have read it
                end = max([end] + [first[r] for r in self.readers.get(i, ()) if dec[r] == RECOMPUTE])
            if first[i] < end:
                diff[first[i]] += self.b[i]
                diff[end] -= self.b[i]
        occ, run = [], 0
        for d in diff[:-1]:
            run += d
            occ.append(run)
        return occ

    def cost(self, dec: dict[int, str], first: dict[int, int] | None = None) -> tuple[float, float, float]:
        """(recompute, link stalls, host) seconds the plan adds to a step."""
        first = self.firsts(dec) if first is None else first
        rec = self.rebuilt(dec, self.r)
        pages = [(self.by_index[i].at_s, self.b[i], self.tau[first[i]]) for i in self.prim if dec[i] == PAGE]
        stall = paging_stall_s(self.model, self.fwd, pages, max(self.budget // 4, 1))
        launch = self.model.launch_s * len(pages)
        return rec, stall, host_added_s(self.fwd, self.model, self.check_s(dec) + launch, launch)

    def windows(self, dec: dict[int, str]) -> list[tuple[int, int]]:
        """The trace check's windows for the recomputed tensors of ``dec`` (activation_costs)."""
        return check_windows([self.by_index[i].span for i in self.prim if dec[i] == RECOMPUTE],
                             self.fwd.edges, self.fwd.ops, self.model.window_join_ops())

    def check_s(self, dec: dict[int, str]) -> float:
        """Host time of the trace check: the operations in its windows, and each window opened
        and closed at module boundaries (one over the whole forward needs none)."""
        wins = self.windows(dec)
        return self.model.check_s(sum(b - a for a, b in wins),
                                  sum(1 for w in wins if w != (0, self.fwd.ops)))

    def total(self, dec: dict[int, str]) -> float:
        return sum(self.cost(dec))

    # -- the family --------------------------------------------------------------------------
    def page_only(self) -> dict[int, str]:
        dec = dict.fromkeys(self.prim, KEEP)
        excess = sum(self.b.values()) - self.budget
        for i in self.prim:  # oldest first: the last backward needs
            if excess <= 0:
                break
            dec[i] = PAGE
            excess -= self.b[i]
        return dec

    def cuts(self, run_budget: int) -> dict[int, str]:
        """Kept cuts (and fixed tensors) so that no recomputed stretch between two holds more
        than ``run_budget`` bytes, the cuts' bytes (crossing sources included) smallest."""
        seq, m = self.prim, len(self.prim)
        fixed = [i not in self.can or self.r[i] >= self.model.move_s(self.b[i]) for i in seq]
        crossing = [0] * (m + 1)
        for s, rs in self.readers.items():
            k, last = self.rank[s], max(self.rank[r] for r in rs)
            if last > k + 1:
                crossing[k + 1] += self.b[s]
                crossing[last] -= self.b[s]
        for k in range(1, m + 1):
            crossing[k] += crossing[k - 1]
        prefix = [0]
        for i in seq:
            prefix.append(prefix[-1] + self.b[i])
        inf = (float("inf"), 0.0)
        dp: dict[int, tuple[float, float]] = {-1: (0.0, 0.0)}
        parent: dict[int, int] = {}
        window: collections.deque[int] = collections.deque([-1])
        lo, last_fixed = -1, -1
        for k in range(m + 1):
            # j in window: a cut (or the start); every tensor strictly between j and k recomputed
            while prefix[k] - prefix[lo + 1] > run_budget:
                lo += 1
            bound = max(lo, last_fixed)
            while window and window[0] < bound:
                window.popleft()
            best = window[0] if window else k - 1
            base = dp.get(best, inf)
            if k == m:
                w: tuple[float, float] = (0.0, 0.0)
            else:
                i = seq[k]
                w = (0.0, 0.0) if fixed[k] else (self.b[i] + crossing[k], -self.r[i])
            dp[k] = (base[0] + w[0], base[1] + w[1])
            parent[k] = best
            if k < m:
                if fixed[k]:
                    last_fixed = k
                while window and dp[window[-1]] >= dp[k]:
                    window.pop()
                window.append(k)
        cut = set()
        k = parent[m]
        while k >= 0:
            cut.add(seq[k])
            k = parent[k]
        dec = {i: (KEEP if (f or i in cut) else RECOMPUTE) for i, f in zip(seq, fixed)}
        ranks = sorted(self.rank[c] for c in cut)
        for s, rs in self.readers.items():  # sever what crosses a cut: its sources kept
            if dec[s] != RECOMPUTE:
                continue
            last = max((self.rank[r] for r in rs if dec[r] == RECOMPUTE), default=-1)
            at = bisect.bisect_right(ranks, self.rank[s])
            if at < len(ranks) and ranks[at] < last:
                dec[s] = KEEP
        return dec

    def repair(self, dec: dict[int, str]) -> bool:
        """Page kept tensors (oldest first) where the occupancy passes the budget; False if it
        cannot be brought within."""
        for _ in range(64):
            first = self.firsts(dec)
            occ = self.occupancy(dec, first)
            peak = max(occ)
            if peak <= self.budget:
                return True
            at = occ.index(peak)
            excess = peak - self.budget
            moved = False
            for i in self.prim:
                if excess <= 0:
                    break
                if dec[i] == KEEP and self.last_use[i] > at and self.first_use[i] > at:
                    dec[i] = PAGE
                    excess -= self.b[i]
                    moved = True
            if not moved:  # recomputed tensors held there: their own recompute triggers paged
                for i in reversed(self.prim):
                    if excess <= 0:
                        break
                    if dec[i] == RECOMPUTE and first[i] <= at < self.last_use[i]:
                        dec[i] = PAGE
                        excess -= self.b[i]
                        moved = True
            if not moved:
                return False
        return False

    def fill(self, dec: dict[int, str]) -> None:
        """Keep recomputed tensors, dearest to recompute per byte first, where the occupancy
        before they would be rebuilt leaves room for them."""
        first = self.firsts(dec)
        occ = self.occupancy(dec, first)
        for i in sorted((i for i in self.prim if dec[i] == RECOMPUTE), key=lambda i: -self.r[i] / self.b[i]):
            f, b = first[i], self.b[i]
            if f > 0 and max(occ[:f]) + b <= self.budget:
                dec[i] = KEEP
                occ[:f] = [o + b for o in occ[:f]]

    def page_hidden(self, dec: dict[int, str], windows: bool = False) -> None:
        """Page recomputed tensors the link hides (dearest to recompute first) while the step gets
        cheaper: each tried against the pages so far, as needed where the plan holds them now."""
        first = self.firsts(dec)
        pages = sorted((self.by_index[i].at_s, self.b[i], self.tau[first[i]]) for i in self.prim if dec[i] == PAGE)
        slack, launch = max(self.budget // 4, 1), self.model.launch_s
        stall = paging_stall_s(self.model, self.fwd, pages, slack)
        recomputes = sum(1 for i in self.prim if dec[i] == RECOMPUTE)
        check, misses = self.check_s(dec), 0
        for i in sorted((i for i in self.prim if dec[i] == RECOMPUTE), key=lambda i: -self.r[i] / self.b[i]):
            trial = list(pages)
            bisect.insort(trial, (self.by_index[i].at_s, self.b[i], self.tau[first[i]]))
            more = paging_stall_s(self.model, self.fwd, trial, slack)
            n = len(pages)
            host_before = host_added_s(self.fwd, self.model, check + launch * n, launch * n)
            # ``windows``: with what paging it takes off the check's windows (a pass over the
            # plan); else the check as it is, unless this is the last recomputed tensor
            dec[i] = PAGE
            after = self.check_s(dec) if windows else check if recomputes > 1 else 0.0
            host_after = host_added_s(self.fwd, self.model, after + launch * (n + 1), launch * (n + 1))
            if more - stall + host_after - host_before < self.r[i]:
                pages, stall, check, recomputes, misses = trial, more, after, recomputes - 1, 0
            else:
                dec[i] = RECOMPUTE
                misses += 1
                if misses >= 8:
                    return

    def recompute_paged(self, dec: dict[int, str]) -> None:
        """Recompute paged tensors, oldest first, where the occupancy still holds the budget and
        the step gets cheaper: repair pages the oldest kept tensors, the largest ones of a
        network that narrows (a CNN's first stages), packed where the forward has run least and
        its outgoing copies hide least, and a tensor a few cheap operations rebuild costs less
        than the link stalls it adds (eight misses in a row end the pass)."""
        rec, stall, host = self.cost(dec)
        best, misses, launches = rec + stall + host, 0, 2 * self.model.launch_s
        for i in [i for i in self.prim if dec[i] == PAGE and i in self.can]:
            if self.r[i] >= launches + stall:
                continue  # it saves at most its copies issued and the stalls: not worth a trial
            dec[i] = RECOMPUTE
            first = self.firsts(dec)
            if max(self.occupancy(dec, first)) <= self.budget and (t := sum(self.cost(dec, first))) < best:
                best, misses = t, 0
                continue
            dec[i] = PAGE
            misses += 1
            if misses >= 8:
                return

    def unstalled(self, dec: dict[int, str]) -> dict[int, str] | None:
        """``dec`` (a copy) with what the copy link hides paged, priced with the check's windows,
        then what its paging stalls recomputed instead (None if it cannot hold the budget)."""
        dec = dict(dec)
        self.page_hidden(dec, windows=True)
        self.recompute_paged(dec)
        self.fill(dec)
        self.cap_flops(dec)
        return dec if self.repair(dec) else None

    def cap_flops(self, dec: dict[int, str]) -> None:
        if self.max_flops is None:
            return
        flops = sum(self.by_index[i].flops for i in self.prim if dec[i] == RECOMPUTE)
        for i in sorted((i for i in self.prim if dec[i] == RECOMPUTE),
                        key=lambda i: -self.by_index[i].flops / self.b[i]):
            if flops <= self.max_flops:
                return
            dec[i] = PAGE
            flops -= self.by_index[i].flops

    def with_recompute(self, run_budget: int) -> dict[int, str] | None:
        dec = self.cuts(run_budget)
        self.cap_flops(dec)
        if not self.repair(dec):
            return None
        self.fill(dec)
        self.page_hidden(dec)
        self.fill(dec)
        self.cap_flops(dec)
        return dec if self.repair(dec) else None


def _segments(p: _Planner, dec: dict[int, str]) -> tuple[int, int]:
    """Recomputed tensors joined through their sources: (how many groups, bytes of the largest)."""
    up = {i: i for i in p.prim if dec[i] == RECOMPUTE}

    def root(i: int) -> int:
        while up[i] != i:
            up[i] = up[up[i]]
            i = up[i]
        return i

    for i in list(up):
        for s in p.by_index[i].sources:
            if s in up:
                up[root(i)] = root(s)
    sizes: dict[int, int] = collections.Counter()
    for i in up:
        sizes[root(i)] += p.b[i]
    return len(sizes), max(sizes.values(), default=0)


def plan_activations(cands: Sequence[Candidate], budget: int, model: CostModel = H100, *,
                     allow_recompute: bool = True, max_recompute_flops: int | None = None,
                     unpack_order: Sequence[int] | None = None, forward: Forward | None = None) -> Plan:
    """One decision per candidate (module docstring). ``unpack_order``: the recorded iteration's
    pack indices in the order backward unpacked them (default: the reverse of the pack order);
    ``forward``: the recorded forward priced on ``model`` (default: none recorded, so no copy
    hides behind compute); ``max_recompute_flops`` caps the FLOPs recomputed per step (None: no cap)."""
    t0 = time.process_time()
    fwd = forward or Forward()
    p = _Planner(cands, budget, model, fwd, unpack_order, max_recompute_flops)
    total = sum(p.b.values())
    chosen, run_budget = dict.fromkeys(p.prim, KEEP), 0
    if total > budget:
        chosen = p.page_only()
        best = p.total(chosen)
        if allow_recompute and p.can:
            largest = max(p.b[i] for i in p.can)
            r, tried = float(budget), set()  # type: float, set[int]
            members: list[tuple[float, int, dict[int, str]]] = [(best, 0, chosen)]
            for _ in range(RUN_BUDGET_STEPS):
                rb = int(r)
                r /= 2 ** 0.5
                if rb < largest and tried:
                    break
                rb = max(rb, largest)
                if rb in tried:
                    continue
                tried.add(rb)
                dec = p.with_recompute(rb)
                if dec is not None:
                    members.append((p.total(dec), rb, dec))
            # the cheapest few again, with what their paging stalls recomputed where that is cheaper
            for t, rb, dec in sorted(members, key=lambda m: m[0])[:UNSTALL_MEMBERS]:
                if t < best:
                    chosen, best, run_budget = dec, t, rb
                more = p.unstalled(dec)
                if more is not None and (t := p.total(more)) < best:
                    chosen, best, run_budget = more, t, rb
    first = p.firsts(chosen)
    occ = p.occupancy(chosen, first)
    rec_s, stall_s, host_s = p.cost(chosen, first) if total > budget else (0.0, 0.0, 0.0)
    rows = []
    for c in cands:
        d = SHARED if c.shared_with is not None else chosen.get(c.index, PAGE)  # 0 bytes: no room, offered again
        cost = p.r[c.index] if d == RECOMPUTE else model.move_s(c.nbytes) if d == PAGE else 0.0
        rows.append(PlanRow(c.index, c.nbytes, c.op, d, cost, c.flops if d == RECOMPUTE else 0, why=c.why))
    segs, largest_seg = _segments(p, chosen)
    wins = p.windows(chosen) if total > budget else []
    summary = PlanSummary(
        budget_bytes=budget, total_bytes=total,
        kept_bytes=sum(r.nbytes for r in rows if r.decision == KEEP),
        paged_bytes=sum(r.nbytes for r in rows if r.decision == PAGE),
        recomputed_bytes=sum(r.nbytes for r in rows if r.decision == RECOMPUTE),
        recompute_flops=int(p.rebuilt(chosen, {i: p.by_index[i].flops for i in p.prim})),
        transfer_s=stall_s, recompute_s=rec_s, cost_model=model.name, check_s=host_s,
        peak_bytes=max(occ) if occ else 0, segments=segs, largest_segment_bytes=largest_seg,
        run_budget_bytes=run_budget, plan_s=time.process_time() - t0, forward_s=fwd.clock_s,
        forward_flops=fwd.flops, checked_ops=sum(b - a for a, b in wins), check_windows=len(wins))
    return Plan(tuple(rows), summary)
