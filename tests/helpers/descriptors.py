"""Descriptor limits for tests of running out of file descriptors.

Owns: :func:`descriptor_limit`, which leaves a process room for exactly N more descriptors
(the limit is on descriptor numbers, so the holes below the highest one are filled first), and
the two probes it rests on.
Invariants: the room is checked before the body runs; the soft limit and every filler
descriptor are restored and closed on the way out, pass or fail.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import resource


@contextlib.contextmanager
def descriptor_limit(spare: int):
    """Room for exactly ``spare`` more descriptors in this process: the holes below its highest
    descriptor filled (the limit is on descriptor numbers, not on their count), the soft
    RLIMIT_NOFILE lowered to just above. The host backend has already raised the soft limit once
    in this process (it does so only once), so it stays lowered. The room is checked before the
    body runs: exactly ``spare`` opens succeed, the next is EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = highest_open_descriptor()
    fillers = []
    try:
        while (fd := os.open("/dev/null", os.O_RDONLY)) < top:
            fillers.append(fd)
        os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1 + spare, hard))
        try:
            assert free_descriptors(spare + 1) == spare, "the helper left other room than asked"
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    finally:
        for fd in fillers:
            os.close(fd)


def highest_open_descriptor() -> int:
    """The highest descriptor open in this process. The listing of /proc/self/fd shows the
    descriptor that reads it, closed by the time the list is returned: each entry is checked, or
    a process with no hole would count that one (it left one slot more than asked, in CI)."""
    def is_open(n: int) -> bool:
        try:
            fcntl.fcntl(n, fcntl.F_GETFD)
            return True
        except OSError:
            return False
    return max(n for n in map(int, os.listdir("/proc/self/fd")) if is_open(n))


def free_descriptors(most: int) -> int:
    """How many more descriptors this process can open, counting up to ``most``; all closed again."""
    opened = []
    try:
        for _ in range(most):
            try:
                opened.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as e:
                assert e.errno == errno.EMFILE, e
                break
        return len(opened)
    finally:
        for fd in opened:
            os.close(fd)
