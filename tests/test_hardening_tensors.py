"""Issue 38, item 6: an allocation a live ``space.tensor()`` owns is freed only by the tensor's death.

Before the fix ``space.free(t.data_ptr())`` was accepted: after ``trim()`` touching the tensor
was a SIGSEGV; without it the next malloc landed on the tensor's address, the tensor wrote
into that unrelated allocation, and the tensor's finalizer then freed it. The first test
failed on the code before the fix (the free was accepted and the next malloc got the
tensor's address).
"""

from __future__ import annotations

import gc

import pytest
import torch
from helpers.spaces import MiB, host_space, pattern
from hypothesis import given, settings
from hypothesis import strategies as st

from vtalloc.allocator import InvalidArgumentError, tensors
from vtalloc.client import ServiceAddressSpace


def test_freeing_a_live_tensors_storage_is_refused_and_changes_nothing():
    with host_space(16 * MiB) as space:
        t = space.tensor((256, 1024), torch.float32)            # 1 MiB
        t.fill_(3.0)
        address = t.data_ptr()
        with pytest.raises(InvalidArgumentError, match="live tensor"):
            space.free(address)
        space.trim()
        other = space.malloc(1 << 20)                           # lands elsewhere: the tensor's bytes are its own
        assert not address <= other < address + (1 << 20)
        space.write(other, pattern(1, 1 << 20))
        assert bool((t == 3.0).all())
        assert space.read(other, 1 << 20) == pattern(1, 1 << 20)
        assert len(space.allocations()) == 2
        del t
        gc.collect()
        assert [a.address for a in space.allocations()] == [other]   # the tensor's death freed its own
        space.free(other)
        assert tensors.release_failures() == []


def test_a_view_keeps_the_refusal_and_its_death_lifts_it():
    with host_space(16 * MiB) as space:
        t = space.tensor((4, 1024), torch.int32)
        address = t.data_ptr()
        row = t[1]
        del t
        with pytest.raises(InvalidArgumentError):
            space.free(address)                                 # the storage lives on in the view
        del row
        gc.collect()
        with pytest.raises(InvalidArgumentError, match="free"):
            space.free(address)                                 # freed by the tensor: now a double free
        assert space.allocations() == []


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 64 << 10)), min_size=1, max_size=12))
def test_no_free_reaches_a_live_tensor_whatever_the_order(ops):
    """The invariant: each live tensor's bytes stay its own whatever else is freed or allocated."""
    with host_space(32 * MiB) as space:
        live = []
        plain = []
        for i, (as_tensor, n) in enumerate(ops):
            if as_tensor:
                t = space.tensor(n, torch.uint8)
                t.fill_(i % 251 + 1)
                live.append((t, i % 251 + 1))
            else:
                plain.append(space.malloc(n))
        for t, _ in live:
            with pytest.raises(InvalidArgumentError):
                space.free(t.data_ptr())
        for a in plain:
            space.free(a)
        space.trim()
        fresh = space.malloc(1 << 20)
        space.write(fresh, b"\x00" * (1 << 20))
        for t, value in live:
            assert bool((t == value).all())
        space.free(fresh)
        live.clear()
        t = None
        gc.collect()
        assert space.allocations() == []


def test_a_service_space_refuses_it_too():
    from helpers.service import Daemon

    with Daemon(capacity="32MiB") as d, ServiceAddressSpace(d.address) as space:
        t = space.tensor(1024, torch.float32)
        with pytest.raises(InvalidArgumentError, match="live tensor"):
            space.free(t.data_ptr())
        del t
        gc.collect()
