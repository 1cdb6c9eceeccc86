"""Small, capped address spaces for tests (never sized by the machine's memory)."""

from __future__ import annotations

import contextlib
import hashlib
import os

from vtalloc.allocator import AddressSpace, PagePool

from .sizes import MiB, PAGE


def host_space(capacity: int | str = 64 * MiB, **kw) -> AddressSpace:
    return AddressSpace(backend="host", capacity=capacity, **kw)


def pattern(seed: int, n: int) -> bytes:
    """Deterministic, non-zero, seed-specific bytes (never test on zeros)."""
    block = hashlib.sha256(seed.to_bytes(8, "little", signed=False)).digest()
    return (block * (n // len(block) + 1))[:n]


@contextlib.contextmanager
def space_for(backend: str, **kw):
    space = AddressSpace(backend=backend, **kw)
    try:
        yield space
    finally:
        space.close()


def lease(pool: PagePool, space: AddressSpace, n: int) -> list[int]:
    """Create ``n`` pages in ``pool`` and import them into the leased ``space``, each tagged
    with its pool id; returns the ids."""
    ids = []
    for _ in range(n):
        pid = pool.create_page()
        fd = pool.export_page(pid)
        try:
            space.import_page(fd, pid)
        finally:
            os.close(fd)
        ids.append(pid)
    return ids
