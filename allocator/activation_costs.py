"""The cost model of the activation plan: what keeping, paging or recomputing adds to a step.

Owns: :class:`CostModel` (one device's rates), the H100's constants (each with its source in
docs/cost-model.md, "The activation plan's constants"), :class:`Forward` (the recorded forward
on that device: its operations, device and host time) and the two prices that are not a sum
of per-tensor costs: the copy link's stalls once its copies overlap compute
(:func:`paging_stall_s`) and host work that hides behind device work (:func:`host_added_s`).
Pure Python: no torch.

The step it prices: the forward's operations run in pack order, each taking
max(device time, one launch) (the host issues the next while the device runs); the backward
takes ``backward_factor`` times as long, in mirror order (the last packed is unpacked first).
A paged tensor is copied out on the link after its pack and back before its first use in
backward; the forward may run ahead of the outgoing copies by ``slack`` bytes (the pager's
release slack) and the incoming copies may run ahead of their use by as many: what the link
cannot hide in those windows stalls the step.
Invariants: every price is >= 0; a plan's modelled time is a prediction, never a measurement.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

__all__ = ["CostModel", "H100", "Forward", "paging_stall_s", "host_added_s", "check_windows", "CHECK_RATIO",
           "WINDOW_RATIO"]

# What the trace check (activation_check.TraceCheck) adds to one aten operation of a later
# iteration's forward, as a multiple of the host time the operation itself takes in eager mode:
# 0.98, measured on this repository's CPU machine (Intel Xeon, 2 cores, torch 2.13, 2026-11-28:
# the small transformer's forward at batch 1, 11.5 us against 11.8 for the operation, the
# fastest of 200; `python benchmarks/bench_check_overhead.py`,
# benchmarks/results/check_overhead-cpu-2026-11-28.json, docs/cost-model.md). A multiple,
# not seconds: both are the same host's Python and dispatcher work, so the ratio carries to a GPU
# host whose per-operation time is the cost model's launch_s (bench_offload_training.py's GPU run
# measures both there: calibration's launch_s and dispatch_mode_per_op_s).
CHECK_RATIO = 0.98
# What opening and closing one window of the trace check adds (its two module hooks, the mode
# pushed and popped: activation_windows), as a multiple of an operation's host time: 1.30,
# measured the same way on the same machine (13.3 us against a plain operation's 10.3, fastest
# of the repeats, 2026-11-28; `python benchmarks/bench_check_overhead.py`,
# benchmarks/results/check_overhead-cpu-2026-11-28b.json, "window_vs_plain_op"; an earlier run
# under heavier load gave 2.42).
WINDOW_RATIO = 1.30


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Seconds to move or recompute bytes on one device."""

    link_bytes_per_s: float      # copy link, each way
    peak_flops: float            # compute rate of matmul-family kernels
    mem_bytes_per_s: float       # memory rate of elementwise kernels
    launch_s: float              # host time to issue one kernel or copy
    name: str = ""
    check_op_s: float | None = None  # host time the trace check adds per forward operation (None: CHECK_RATIO x launch_s)
    backward_factor: float = 2.0     # backward's time per forward's

    def check_op_cost_s(self) -> float:
        """Host time the trace check adds to one watched forward operation."""
        return self.check_op_s if self.check_op_s is not None else CHECK_RATIO * self.launch_s

    def check_s(self, ops: int, windows: int = 0) -> float:
        """Host time the trace check adds to a forward where it watches ``ops`` operations in
        ``windows`` windows opened and closed at module boundaries (0: over the whole forward)."""
        return ops * self.check_op_cost_s() + windows * WINDOW_RATIO * self.launch_s

    def window_join_ops(self) -> float:
        """Two windows this few operations apart cost less joined (the operations between
        watched) than apart (one more window opened and closed)."""
        per = self.check_op_cost_s()
        return WINDOW_RATIO * self.launch_s / per if per > 0 else 0.0

    def device_s(self, flops: int, touched: int) -> float:
        """Device time of work of ``flops`` and ``touched`` bytes: its roofline."""
        return max(flops / self.peak_flops, touched / self.mem_bytes_per_s)

    def run_s(self, flops: int, touched: int, ops: int = 1) -> float:
        """Time ``ops`` operations add to a step: their device time, or their launches where
        the host is slower (it issues the next while the device runs)."""
        return max(self.device_s(flops, touched), ops * self.launch_s)

    def move_s(self, nbytes: int) -> float:
        """Out to host and back with nothing to hide behind: each way the bytes over the link
        and one copy issued (an upper bound of what paging a tensor costs)."""
        return 2 * (nbytes / self.link_bytes_per_s + self.launch_s)


# H100 (80GB HBM3, SXM). Sources (docs/cost-model.md, "The activation plan's constants"):
# link: pinned copies at 256 MiB, 55.1 GB/s D2H / 54.8 H2D, measured 2026-11-22 (the lower one);
# compute: 434 TFLOP/s, fitted to the measured uncapped step of the 2048-wide benchmark
# transformer (0.0992 s at batch 16, bf16, 2026-11-26: 4.31e13 FLOPs / step); memory: 3.35 TB/s
# (datasheet, not measured); launch: 5 us (an estimate, not measured).
H100 = CostModel(link_bytes_per_s=54.8e9, peak_flops=434e12, mem_bytes_per_s=3.35e12, launch_s=5e-6, name="h100")


@dataclasses.dataclass(frozen=True)
class Forward:
    """The recorded forward priced on one device (``Forward.of``); zero: not recorded."""

    ops: int = 0              # aten operations
    clock_s: float = 0.0      # its duration: per operation max(device, launch), summed
    device_s: float = 0.0     # device time alone
    host_s: float = 0.0       # host time alone (one launch per operation)
    flops: int = 0            # its FLOPs, every operation counted as a recompute's are
    edges: tuple[int, ...] = ()  # positions where the trace check may open or close a window
    #                              (module boundaries; none: it watches the whole forward)

    def backward_s(self, model: CostModel) -> float:
        return self.clock_s * model.backward_factor


def host_added_s(fwd: Forward, model: CostModel, forward_extra_s: float, backward_extra_s: float) -> float:
    """What host work added to the forward and to the backward (the trace check, copies
    issued) costs a step: nothing while the device is the slower of the two, the excess after."""
    bf = model.backward_factor
    out = 0.0
    for dev, host, extra in ((fwd.device_s, fwd.host_s, forward_extra_s),
                             (fwd.device_s * bf, fwd.host_s * bf, backward_extra_s)):
        if extra > 0:
            out += max(dev, host + extra) - max(dev, host)
    return out


def paging_stall_s(model: CostModel, fwd: Forward, pages: Sequence[tuple[float, int, float]], slack: int) -> float:
    """Seconds the copy link stalls a step. ``pages``: per paged tensor (its pack time in the
    forward, its bytes, the backward time of its first use), in pack order; ``slack``: bytes the
    forward may run ahead of the outgoing copies, and the incoming copies ahead of their use.
    With no recorded forward (``fwd.clock_s`` 0) nothing overlaps: every copy stalls."""
    bw = model.link_bytes_per_s
    if not pages:
        return 0.0
    if fwd.clock_s <= 0:
        return sum(2 * b / bw for _, b, _ in pages)
    slack = max(slack, 1)
    # Forward: copies out in pack order, each from its pack on; the forward waits while more
    # than `slack` bytes are packed and not yet out.
    stall_f, free = 0.0, 0.0
    out_end: list[float] = []
    head = backlog = 0
    for at, b, _ in pages:
        t = at + stall_f
        start = max(t, free)
        free = start + b / bw
        out_end.append(free)
        backlog += b
        while head < len(out_end) and out_end[head] <= t:
            backlog -= pages[head][1]
            head += 1
        while backlog > slack and head < len(out_end) - 1:  # the newest may be in flight
            stall_f += max(out_end[head] - t, 0.0)
            t = at + stall_f
            backlog -= pages[head][1]
            head += 1
    fwd_end = fwd.clock_s + stall_f
    # Backward: copies back in order of first use, each once its copy out is done and at most
    # `slack` bytes ahead of its use; a use before its copy is back waits.
    order = sorted(range(len(pages)), key=lambda k: pages[k][2])
    stall_b, free, lo, ahead = 0.0, 0.0, 0, 0
    used_at: list[float] = []
    for pos, k in enumerate(order):
        at, b, need = pages[k]
        ahead += b
        while ahead > slack and lo < pos:
            ahead -= pages[order[lo]][1]
            lo += 1
        may_start = used_at[lo - 1] if lo > 0 else 0.0
        start = max(free, out_end[k] - fwd_end, may_start)
        free = start + b / bw
        use = need + stall_b
        if free > use:
            stall_b += free - use
            use = free
        used_at.append(use)
    return stall_f + stall_b


def check_windows(spans: Sequence[tuple[int, int] | None], edges: Sequence[int], ops: int,
                  join: float = 0.0) -> list[tuple[int, int]]:
    """The windows [open, close) of forward positions the trace check must watch so that every
    span (first, last position a recomputed tensor's recipe replays or reads) lies inside one:
    each opened at the last edge at or before its first position and closed at the first edge
    after its last; windows that overlap, touch or lie at most ``join`` operations apart joined
    (``CostModel.window_join_ops``: what costs less). ``edges`` sorted; a span of None (not
    known) or no edges: the whole forward, as one window from position 0 (opened at the context's
    entry, no edge needed)."""
    if not spans:
        return []
    if not edges or any(s is None for s in spans):
        return [(0, ops)]
    wins: list[tuple[int, int]] = []
    for first, last in sorted(s for s in spans if s is not None):
        k = bisect.bisect_right(edges, first) - 1
        lo = edges[k] if k >= 0 else 0
        k = bisect.bisect_left(edges, last + 1)
        hi = edges[k] if k < len(edges) else ops
        if wins and lo - wins[-1][1] <= join:
            wins[-1] = (wins[-1][0], max(wins[-1][1], hi))
        else:
            wins.append((lo, hi))
    return wins
