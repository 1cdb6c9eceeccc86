"""Thread safety: many threads allocating, writing, reading and freeing one space."""

from __future__ import annotations

import random
import threading

from helpers.spaces import MiB, host_space, pattern
from helpers.threads import run_threads


def test_concurrent_malloc_free_keeps_every_byte():
    with host_space(128 * MiB) as space:
        def worker(seed: int) -> None:
            rng = random.Random(seed)
            mine: list[tuple[int, int, int]] = []
            for step in range(400):
                if mine and rng.random() < 0.45:
                    a, n, tag = mine.pop(rng.randrange(len(mine)))
                    assert space.read(a, n) == pattern(tag, n)
                    space.free(a)
                else:
                    n = rng.choice([64, 512, 3000, 70_000, MiB, 2 * MiB + 5])
                    try:
                        a = space.malloc(n)
                    except MemoryError:
                        continue
                    tag = seed * 100_000 + step
                    space.write(a, pattern(tag, n))
                    mine.append((a, n, tag))
            for a, n, tag in mine:
                assert space.read(a, n) == pattern(tag, n)
                space.free(a)

        errors = run_threads(worker, [(i,) for i in range(8)])
        assert not errors, errors[0]
        s = space.stats()
        assert s.num_live_allocs == 0 and s.allocated_bytes == 0 and s.active_bytes == 0
        assert s.num_allocs == s.num_frees
        assert s.peak_mapped_bytes <= s.capacity_bytes


def test_close_while_other_threads_allocate_is_safe():
    from vtalloc.allocator import ClosedError

    space = host_space(32 * MiB)
    allocating = threading.Barrier(5)  # the 4 threads, each after its first malloc+free, and the closer
    safety = threading.Event()  # only if close() never reaches them: ends the loops so the test fails, not hangs
    seen: list[str] = []

    def hammer() -> None:
        first = True
        while not safety.is_set():
            try:
                a = space.malloc(4096)
                space.free(a)
            except ClosedError:
                seen.append("closed")
                return
            except Exception as e:  # anything else is a bug
                seen.append(repr(e))
                return
            if first:
                allocating.wait(timeout=60)
                first = False

    def close_under_them() -> None:
        allocating.wait(timeout=60)  # every thread is allocating now
        space.close()

    timer = threading.Timer(60, safety.set)
    timer.start()
    try:
        assert run_threads(hammer, [()] * 4, between=close_under_them) == []
    finally:
        timer.cancel()
    assert seen == ["closed"] * 4, seen
