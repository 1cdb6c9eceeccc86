"""Bad input gets a typed error and loses nothing: sizes, pointers, closed spaces, backends."""

from __future__ import annotations

import pytest

from vtalloc.allocator import (
    AddressSpace,
    BackendUnavailableError,
    ClosedError,
    InvalidArgumentError,
    OutOfMemoryError,
    VtallocError,
    backend_available,
)
from helpers.spaces import MiB, host_space, pattern


@pytest.fixture
def space():
    with host_space(16 * MiB) as s:
        yield s


def test_hierarchy():
    assert issubclass(OutOfMemoryError, MemoryError) and issubclass(OutOfMemoryError, VtallocError)
    assert issubclass(InvalidArgumentError, ValueError) and issubclass(InvalidArgumentError, VtallocError)


@pytest.mark.parametrize("bad", [0, -1, -(1 << 70), 1 << 64, 1 << 47, 1.5, 2.0, "12", None, True, b"x", [1]])
def test_bad_sizes(space, bad):
    before = space.stats()
    with pytest.raises(InvalidArgumentError):
        space.malloc(bad)
    assert space.stats() == before


def test_size_beyond_capacity_is_oom_not_invalid(space):
    with pytest.raises(OutOfMemoryError):
        space.malloc(17 * MiB)


def test_double_free(space):
    a = space.malloc(4096)
    space.free(a)
    with pytest.raises(InvalidArgumentError):
        space.free(a)


def test_double_free_of_large(space):
    a = space.malloc(4 * MiB)
    space.free(a)
    with pytest.raises(InvalidArgumentError):
        space.free(a)


def test_interior_and_foreign_pointers(space):
    a = space.malloc(4 * MiB)
    space.write(a, pattern(3, 4 * MiB))
    for bad in (a + 512, a + 2 * MiB, 0, 12345, 1 << 63, (1 << 64) - 1):
        with pytest.raises(InvalidArgumentError):
            space.free(bad)
        with pytest.raises(InvalidArgumentError):
            space.size_of(bad)
    for bad in (-1, 1 << 64, "0x10", 1.0, None):
        with pytest.raises(InvalidArgumentError):
            space.free(bad)
    assert space.read(a, 4 * MiB) == pattern(3, 4 * MiB)  # nothing lost
    space.free(a)


def test_pointer_from_another_space(space):
    with host_space(8 * MiB) as other:
        b = other.malloc(4096)
        with pytest.raises(InvalidArgumentError):
            space.free(b)
        other.free(b)


def test_reads_and_writes_outside_an_allocation(space):
    a = space.malloc(1000)
    space.write(a, b"x" * 1000)
    with pytest.raises(InvalidArgumentError):
        space.write(a, b"y" * 1001)
    with pytest.raises(InvalidArgumentError):
        space.write(a, b"y", offset=1000)
    with pytest.raises(InvalidArgumentError):
        space.read(a, 10, offset=995)
    with pytest.raises(InvalidArgumentError):
        space.read(a, 1, offset=1 << 63)
    with pytest.raises(InvalidArgumentError):
        space.read(a + 1000, 1)  # inside the rounded block, past the requested size
    with pytest.raises(InvalidArgumentError):
        space.write(a, "not bytes")
    assert space.read(a, 1000) == b"x" * 1000
    space.write(a, bytearray(b"abc"), offset=10)
    space.write(a, memoryview(b"def"), offset=13)
    assert space.read(a + 10, 6) == b"abcdef"  # interior address for reads is allowed
    space.free(a)
    with pytest.raises(InvalidArgumentError):
        space.read(a, 1)


def test_closed_space():
    space = host_space(8 * MiB)
    a = space.malloc(4096)
    space.close()
    space.close()  # idempotent
    assert space.closed
    for call in (lambda: space.malloc(1), lambda: space.free(a), lambda: space.stats(),
                 lambda: space.read(a, 1), lambda: space.pages(), lambda: space.trim()):
        with pytest.raises(ClosedError):
            call()


def test_invalid_configuration():
    for kwargs in ({"backend": "tpu"}, {"capacity": 0}, {"capacity": "lots"}, {"capacity": -5},
                   {"page_size": 3 * MiB}, {"page_size": 4096}, {"capacity": MiB},
                   {"small_threshold": 4 * MiB}, {"device": -1}, {"device": "0"}, {"host_granularity": 12345}):
        with pytest.raises(InvalidArgumentError):
            AddressSpace(**{"backend": "host", **kwargs})


def test_cuda_unavailable_is_typed():
    ok, why = backend_available("cuda")
    if ok:
        pytest.skip("a CUDA device is present")
    assert why
    with pytest.raises(BackendUnavailableError):
        AddressSpace(backend="cuda")
    with AddressSpace(backend="auto", capacity=8 * MiB) as space:
        assert space.backend == "host"


def test_cuda_device_out_of_range_is_typed():
    with pytest.raises(BackendUnavailableError):
        AddressSpace(backend="cuda", device=999)


def test_python_status_codes_are_vtalloc_h():
    import re
    from pathlib import Path

    from vtalloc.allocator.errors import Status

    header = (Path(__file__).resolve().parents[1] / "csrc/include/vtalloc/vtalloc.h").read_text()
    in_c = {name: int(value) for name, value in re.findall(r"\bVTA_(OK|ERR_[A-Z_]+) = (\d+)", header)}
    assert len(in_c) >= 8
    assert {("OK" if m.name == "OK" else "ERR_" + m.name): m.value for m in Status} == in_c
