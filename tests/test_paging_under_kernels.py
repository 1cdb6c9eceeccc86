"""Paging, restore, reclaim and frees under stream work that is still running: no fault, no
corrupted byte, and the same test fails when an ordering rule is broken.

The host backend's test kernels (docs/design.md) stand in for GPU kernels: FILL writes an
allocation's pattern, CHECK counts the bytes that differ from it, each for a while, on the
worker thread of a stream; an access to an address that is not mapped at that moment is a
fault (on a GPU, CUDA_ERROR_ILLEGAL_ADDRESS). A seeded random program allocates on three
streams (sizes whose blocks share pages and sizes of several pages), fills and checks, offloads
(then, in mapped mode, reads late, as a residual connection does), prefetches, frees with
kernels still running, and runs under memory pressure, so that every path of docs/eviction.md
("Ordering") changes mappings while kernels run. The program keeps the eviction contract: an
offloaded allocation is only read (mapped mode) until it is restored, and in copy mode stream
work touches an evictable allocation only after `ensure_resident`/`prefetch` on its stream.

`VTALLOC_SLOW_TESTS=1` (tests/helpers/slow.py) runs each configuration for a minute instead of a few seconds.
"""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from vtalloc.allocator import AddressSpace, HostPoolExhaustedError, InvalidArgumentError, OutOfMemoryError
from helpers.slow import slow_tests
from helpers.spaces import MiB

SECONDS = 60.0 if slow_tests() else 4.0
BROKEN_LIMIT_S = 30.0  # a broken rule must show well within this
SIZES = [3000, 100_000, 700_000, 2 * MiB, 3 * MiB + 5, 5 * MiB]
KERNEL_S = [0.0, 0.0005, 0.002]


@dataclasses.dataclass
class Live:
    size: int
    stream: int
    seed: int
    evictable: bool = False
    offloaded: bool = False


@dataclasses.dataclass(frozen=True)
class Outcome:
    ops: int
    kernels: int
    faults: int          # kernels stopped by an access to an unmapped address
    copy_faults: int     # engine copies stopped likewise
    mismatched: int      # bytes CHECK kernels found different from what was last written
    checked: int
    evictions: int
    restores: int
    pressure_evictions: int

    @property
    def failed(self) -> bool:
        return bool(self.faults or self.copy_faults or self.mismatched)


class Program:
    """One seeded random run over one host-backend space."""

    def __init__(self, space: AddressSpace, mode: str, rng: random.Random) -> None:
        self.space, self.mode, self.rng = space, mode, rng
        self.streams = [space._create_stream() for _ in range(3)]
        self.live: dict[int, Live] = {}
        self.next_seed = 1
        self.ops = 0

    def kernel(self, a: int, kind: str, seconds: float | None = None) -> None:
        x = self.live[a]
        if kind == "fill":
            x.seed, self.next_seed = self.next_seed, self.next_seed + 1
        s = self.rng.choice(KERNEL_S) if seconds is None else seconds
        self.space._run_kernel(a, x.size, stream=x.stream, kind=kind, seed=x.seed, duration_s=s)

    def make_usable(self, a: int, kind: str) -> None:
        """The contract: writes need the allocation resident; in copy mode so do reads of an
        evictable allocation (pressure may have evicted it); mapped mode serves late reads."""
        x = self.live[a]
        if kind == "fill" or (self.mode == "copy" and (x.evictable or x.offloaded)):
            self.space.ensure_resident(a)
            x.offloaded = False

    def pick(self, pred=lambda x: True) -> int | None:
        cands = [a for a, x in self.live.items() if pred(x)]
        return self.rng.choice(cands) if cands else None

    def step(self) -> None:
        rng, space = self.rng, self.space
        op = rng.choices(["alloc", "use", "fill_offload", "offload", "prefetch", "check_free", "free", "trim", "sync"],
                         [24, 24, 10, 10, 10, 8, 8, 2, 2])[0]
        self.ops += 1
        try:
            if op == "alloc":
                size, stream = rng.choice(SIZES), rng.choice(self.streams)
                a = space.malloc(size, stream)  # under pressure: evicts, releases, reclaims
                self.live[a] = Live(size, stream, 0)
                self.kernel(a, "fill")
                if rng.random() < 0.7:
                    space.set_evictable(a)
                    self.live[a].evictable = True
            elif op == "use" and (a := self.pick()) is not None:
                kind = "fill" if rng.random() < 0.3 else "check"
                self.make_usable(a, kind)
                self.kernel(a, kind)
            elif op == "fill_offload" and (a := self.pick(lambda x: x.evictable)) is not None:
                self.make_usable(a, "fill")
                self.kernel(a, "fill", 0.001)  # the copy must wait for this write
                space.offload(a)
                self.live[a].offloaded = True
            elif op == "offload" and (a := self.pick(lambda x: x.evictable and not x.offloaded)) is not None:
                space.offload(a)
                self.live[a].offloaded = True
                if self.mode == "mapped" and rng.random() < 0.7:
                    self.kernel(a, "check", 0.002)  # a late read, as of a residual connection
            elif op == "prefetch" and (a := self.pick(lambda x: x.offloaded)) is not None:
                space.prefetch(a)  # its stream is ordered after the copies
                self.live[a].offloaded = False
                if rng.random() < 0.7:
                    self.kernel(a, "check")
            elif op == "check_free" and (a := self.pick()) is not None:
                self.make_usable(a, "check")
                self.kernel(a, "check", 0.002)
                space.free(a)  # stream-ordered: the memory waits for the kernel
                del self.live[a]
            elif op == "free" and (a := self.pick()) is not None:
                space.free(a)
                del self.live[a]
            elif op == "trim":
                space.trim()
            elif op == "sync":
                space.synchronize()
        except (OutOfMemoryError, HostPoolExhaustedError):
            pass  # everything resident is pinned or the host pool is full: a valid answer
        except InvalidArgumentError as e:
            if "shared with an allocation not marked evictable" not in str(e):
                raise

    def finish(self) -> None:
        """Every live allocation checked once more where it is, then freed: the pinned ones
        first, then one at a time those that may need restoring (by then there is room)."""
        for a in sorted(self.live, key=lambda a: self.live[a].evictable):
            x = self.live[a]
            self.make_usable(a, "check")
            self.kernel(a, "check", 0.0)
            self.space._synchronize_stream(x.stream)
            self.space.free(a)
            del self.live[a]
        self.space.synchronize()
        for s in self.streams:
            self.space._destroy_stream(s)


def stress(mode: str, seconds: float, *, broken: tuple[str, ...] = (), seed: int = 0, stop_on_failure: bool = False) -> Outcome:
    with AddressSpace(backend="host", capacity=16 * MiB, host_capacity=256 * MiB, evict_mode=mode) as space:
        if broken:
            space._break_ordering(*broken)
        prog = Program(space, mode, random.Random(seed))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            prog.step()
            if stop_on_failure and prog.ops % 16 == 0:
                k = space._kernel_counters()
                if k.kernels_faulted or k.copy_faults or k.bytes_mismatched:
                    break
        prog.finish()
        k, st = space._kernel_counters(), space.stats()
    return Outcome(ops=prog.ops, kernels=k.kernels_launched, faults=k.kernels_faulted, copy_faults=k.copy_faults,
                   mismatched=k.bytes_mismatched, checked=k.bytes_checked, evictions=st.evictions,
                   restores=st.restores, pressure_evictions=st.pressure_evictions)


@pytest.mark.parametrize("mode", ["mapped", "copy"])
def test_paging_under_running_kernels_faults_nothing_and_corrupts_nothing(mode):
    out = stress(mode, SECONDS, seed=1)
    assert out.faults == 0 and out.copy_faults == 0, out
    assert out.mismatched == 0, out
    # The run exercised what it claims to: kernels checked bytes, pages went out and came back
    # under pressure.
    assert out.kernels > 200 and out.checked > 0, out
    assert out.evictions > 20 and out.restores > 20 and out.pressure_evictions > 0, out


@pytest.mark.host_faults
@pytest.mark.parametrize("mode, rule", [
    ("mapped", "quiesce"),     # release/swap under a late read or a pending free's kernel: faults
    ("copy", "copy_order"),    # the copy overtakes the last write: stale bytes come back
    ("mapped", "copy_order"),
    ("copy", "free_wait"),     # freed memory reused or unmapped under a running kernel
    ("mapped", "free_wait"),
])
def test_the_same_program_fails_when_an_ordering_rule_is_broken(mode, rule):
    out = stress(mode, BROKEN_LIMIT_S, broken=(rule,), seed=2, stop_on_failure=True)
    assert out.failed, f"breaking {rule!r} went unnoticed: {out}"


def test_a_wait_is_for_the_record_it_was_issued_after():
    """Found by the program above: the eviction copy of a page shared by allocations on two
    streams waits on one event recorded on each stream in turn (a pooled event, as CUDA allows:
    cuStreamWaitEvent waits for the record current when it is issued). The host backend once let
    the second record, on an idle stream, release the wait for the first, on a busy one, so the
    copy overtook the last write. A busy stream and an idle one, deterministic."""
    with AddressSpace(backend="host", capacity=16 * MiB, host_capacity=64 * MiB, evict_mode="copy") as space:
        busy, idle = space._create_stream(), space._create_stream()
        x, y = space.malloc(4096, busy), space.malloc(4096, idle)
        assert x // (2 * MiB) == y // (2 * MiB), "both on one shared page"
        space._run_kernel(x, 4096, stream=busy, kind="fill", seed=1)
        space._run_kernel(x, 4096, stream=busy, kind="check", seed=1, duration_s=0.2)  # keeps `busy` busy
        space._run_kernel(x, 4096, stream=busy, kind="fill", seed=2)  # the last write before the offload
        space.set_evictable(x)
        space.set_evictable(y)
        space.offload(x)  # one copy for the page, after an event on `busy` and one on `idle`
        space.synchronize()
        assert space.residency(x) == "evicted"
        space.ensure_resident(x)
        space._run_kernel(x, 4096, stream=busy, kind="check", seed=2)
        space._synchronize_stream(busy)
        k = space._kernel_counters()
        assert k.kernels_completed == 4 and k.bytes_mismatched == 0, k
        space.free(x)
        space.free(y)
        space.synchronize()
        space._destroy_stream(busy)
        space._destroy_stream(idle)
