"""Test kernels on the host backend: the pattern they write, and making a range inaccessible.

``kernel_pattern`` is an independent Python reference of csrc/backend/testing/host_kernels.hpp's
pattern: byte ``i`` of a kernel's range is byte ``i % 8`` (little-endian) of the word hash of
``(seed, i // 8)``. ``inaccessible`` mprotects a range PROT_NONE for a while, which is what an
unmap does to the bytes under running stream work (without touching the backend's tables).
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from collections.abc import Iterator

_M = (1 << 64) - 1
PROT_NONE, PROT_READ_WRITE = 0, 3

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mprotect.restype = ctypes.c_int


def pattern_word(seed: int, word: int) -> int:
    x = (seed * 0xD1B54A32D192ED03 + (word + 1) * 0x9E3779B97F4A7C15) & _M
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & _M
    return x ^ (x >> 32)


def kernel_pattern(seed: int, nbytes: int) -> bytes:
    """The bytes a FILL kernel with ``seed`` writes over a range of ``nbytes``."""
    words = (nbytes + 7) // 8
    return b"".join(struct.pack("<Q", pattern_word(seed, i)) for i in range(words))[:nbytes]


def mprotect(address: int, nbytes: int, prot: int) -> None:
    if _libc.mprotect(address, nbytes, prot) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect({address:#x}, {nbytes}, {prot}) failed")


@contextlib.contextmanager
def inaccessible(address: int, nbytes: int) -> Iterator[None]:
    """``[address, address + nbytes)`` (page-aligned) faults on any access inside the block."""
    mprotect(address, nbytes, PROT_NONE)
    try:
        yield
    finally:
        mprotect(address, nbytes, PROT_READ_WRITE)
