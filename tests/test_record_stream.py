"""record_stream (docs/design.md, "record_stream"): a block used on other streams is not
reused, not even on its own stream, until the work queued on each of them up to its free
completed; an allocation that would otherwise fail waits for that work."""

from __future__ import annotations

import time

import pytest

from helpers.spaces import MiB, host_space
from vtalloc.allocator import InvalidArgumentError
from vtalloc.allocator.torch import native_abi as native
from vtalloc.allocator.torch import shim
from vtalloc.allocator import Config


@pytest.mark.parametrize("size", [4096, 2 * MiB])
def test_a_block_used_on_another_stream_waits_for_its_work(size):
    with host_space(64 * MiB) as space:
        own, other = space._create_stream(), space._create_stream()
        busy = space.malloc(4096, other)
        a = space.malloc(size, own)
        space.record_stream(a, other)
        space._run_kernel(busy, 4096, stream=other, duration_s=0.3)  # `other` still has work queued
        space.free(a)
        b = space.malloc(size, own)
        assert b != a, "reused on its own stream while the recorded stream still ran"
        assert space.stats().pending_free_bytes >= size
        space._synchronize_stream(other)
        space.free(b)
        c = space.malloc(size, own)
        assert c in (a, b), "once the recorded stream passed it, the block is reused"
        for x in (c, busy):
            space.free(x)
        space._destroy_stream(own)
        space._destroy_stream(other)


def test_without_record_stream_same_stream_reuse_is_at_once():
    with host_space(64 * MiB) as space:
        own, other = space._create_stream(), space._create_stream()
        busy = space.malloc(4096, other)
        a = space.malloc(8192, own)
        space._run_kernel(busy, 4096, stream=other, duration_s=0.2)
        space.free(a)
        assert space.malloc(8192, own) == a
        space.free(a)
        space.free(busy)
        space._synchronize_stream(other)
        space._destroy_stream(own)
        space._destroy_stream(other)


def test_an_allocation_that_would_fail_waits_for_recorded_streams():
    with host_space(8 * MiB, page_size=2 * MiB) as space:
        own, other = space._create_stream(), space._create_stream()
        busy = space.malloc(4096, other)
        a = space.malloc(6 * MiB, own)
        space.record_stream(a, other)
        space._run_kernel(busy, 4096, stream=other, duration_s=0.2)
        space.free(a)
        start = time.monotonic()
        b = space.malloc(6 * MiB, 0)  # only fits in a's memory: waits for `other`
        assert time.monotonic() - start > 0.05
        assert space.stats().num_alloc_retries >= 1
        space.free(b)
        space.free(busy)
        space._destroy_stream(own)
        space._destroy_stream(other)


def test_record_stream_bad_input_is_typed():
    with host_space(16 * MiB) as space:
        a = space.malloc(4096)
        with pytest.raises(InvalidArgumentError):
            space.record_stream(a + 512, 0)  # interior pointer
        with pytest.raises(InvalidArgumentError):
            space.record_stream(a, 12345)  # a stream the host backend does not know
        space.record_stream(a, 0)  # its own stream: nothing
        space.free(a)
        with pytest.raises(InvalidArgumentError):
            space.record_stream(a, 0)  # freed


def test_record_stream_through_the_shim():
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    try:
        p = native.malloc(4096)
        native.record_stream(p, 0)  # its own stream: nothing
        with pytest.raises(InvalidArgumentError):
            native.record_stream(p, 777)  # not a stream of the host backend
        with pytest.raises(InvalidArgumentError):
            native.record_stream(p + 4 * MiB * 1000, 0)
        native.free(p)
    finally:
        shim.release()



@pytest.mark.parametrize("mode", ["copy", "mapped"])
def test_eviction_copies_after_the_writes_of_a_recorded_stream(mode):
    """A write queued on a stream recorded on the allocation before its offload is part of what
    the eviction copies: the copy follows every recorded stream, not only the allocation's own."""
    with host_space(16 * MiB, host_capacity=64 * MiB, evict_mode=mode) as space:
        own, other = space._create_stream(), space._create_stream()
        busy = space.malloc(4096, other)
        a = space.malloc(2 * MiB, own)
        space.set_evictable(a)
        space.record_stream(a, other)
        space._run_kernel(busy, 4096, stream=other, duration_s=0.2)  # the write below runs late
        space._run_kernel(a, 2 * MiB, stream=other, kind="fill", seed=7)
        space.offload(a)
        space._synchronize_stream(other)  # the write landed (on the device page, still held)
        space.synchronize()  # the held device page is released: the host copy is all there is
        space.ensure_resident(a, own)
        space._run_kernel(a, 2 * MiB, stream=own, kind="check", seed=7)
        space._synchronize_stream(own)
        k = space._kernel_counters()
        assert (k.kernels_faulted, k.copy_faults, k.bytes_mismatched) == (0, 0, 0), k
        assert k.bytes_checked == 2 * MiB
        for x in (a, busy):
            space.free(x)
        space._destroy_stream(own)
        space._destroy_stream(other)
