"""torch CPU tensors over a host-backend address space: no copy, freed on death, safe close."""

from __future__ import annotations

import gc

import pytest
import torch

from helpers.spaces import MiB, host_space, pattern
from vtalloc.allocator import ClosedError, InvalidArgumentError, OutOfMemoryError, global_counters
from vtalloc.allocator import tensors


def _allocation_of(space, tensor):
    """The live allocation that holds the tensor's storage (exactly one must)."""
    ptr = tensor.untyped_storage().data_ptr()
    hits = [a for a in space.allocations() if a.address <= ptr < a.address + a.size_bytes]
    assert len(hits) == 1, f"storage at {ptr:#x} is not inside exactly one allocation: {space.allocations()}"
    return hits[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_storage_is_an_allocation_of_the_space(dtype):
    with host_space() as space:
        t = space.tensor((3, 7), dtype=dtype)
        assert t.shape == (3, 7) and t.dtype == dtype and t.device.type == "cpu"
        a = _allocation_of(space, t)
        assert a.address == t.data_ptr()
        assert a.requested_bytes == 21 * t.element_size()
        del t


def test_default_dtype_is_float32_and_shapes_accept_ints_and_sizes():
    with host_space() as space:
        assert space.tensor(5).shape == (5,)
        assert space.tensor(torch.Size([2, 3])).dtype == torch.float32
        assert space.tensor([]).shape == ()  # a scalar: one element


def test_no_copy_both_ways():
    with host_space() as space:
        t = space.tensor((256,), dtype=torch.uint8)
        addr = t.data_ptr()
        data = pattern(1, 256)
        space.write(addr, data)
        assert bytes(t.tolist()) == data  # written through the space, seen by the tensor
        t.copy_(torch.arange(256, dtype=torch.uint8))
        assert space.read(addr, 256) == bytes(range(256))  # written by torch, read through the space
        del t


def test_large_tensor_spans_pages_and_keeps_its_bytes():
    with host_space(capacity=32 * MiB) as space:
        t = space.tensor((5 * MiB // 4,), dtype=torch.int32)
        t.copy_(torch.arange(t.numel(), dtype=torch.int32))
        assert _allocation_of(space, t).size_bytes == 5 * MiB  # on three 2 MiB pages
        assert space.stats().mapped_bytes == 6 * MiB
        assert space.read(t.data_ptr(), 4, offset=4 * (t.numel() - 1)) == (t.numel() - 1).to_bytes(4, "little")
        assert int(t[-1]) == t.numel() - 1
        del t


def test_freed_when_the_last_view_dies():
    with host_space() as space:
        t = space.tensor((64, 64))
        view = t[10:20]
        del t
        gc.collect()
        assert len(space.allocations()) == 1  # the view keeps the storage
        assert tensors.live_tensor_storages(space) == 1
        del view
        gc.collect()
        assert space.allocations() == []
        assert tensors.live_tensor_storages(space) == 0
        assert space.stats().num_frees == 1


def test_empty_tensor_still_lives_in_the_space():
    with host_space() as space:
        t = space.tensor((0, 3))
        assert t.numel() == 0 and t.shape == (0, 3)
        _allocation_of(space, t)
        del t
        gc.collect()
        assert space.allocations() == []


@pytest.mark.parametrize(
    "shape, dtype, match",
    [
        ((-1, 2), None, "non-negative"),
        ((2.5,), None, "ints"),
        (True, None, "bool"),
        ("abc", None, "ints"),
        ((2,), "float32", "torch.dtype"),
        ((2,), torch.qint8, "quantized"),
    ],
)
def test_bad_arguments_change_nothing(shape, dtype, match):
    with host_space() as space:
        with pytest.raises(InvalidArgumentError, match=match):
            space.tensor(shape, dtype=dtype)
        assert space.allocations() == []


def test_too_large_is_out_of_memory_and_loses_nothing():
    with host_space(capacity=8 * MiB) as space:
        keep = space.tensor((1024,))
        with pytest.raises(OutOfMemoryError):
            space.tensor((16 * MiB,), dtype=torch.uint8)
        assert len(space.allocations()) == 1
        del keep


def test_closed_space_makes_no_tensor():
    space = host_space()
    space.close()
    with pytest.raises(ClosedError):
        space.tensor((4,))


def test_close_while_tensors_live_keeps_their_pages_until_they_die():
    space = host_space()
    t = space.tensor((1024,))
    t.fill_(3.0)
    space.close()
    assert space.closed
    with pytest.raises(ClosedError):
        space.malloc(16)  # closed to every new operation at once
    with pytest.raises(ClosedError):
        space.tensor((4,))
    assert global_counters()["live_pages"] > 0  # ...but the tensor's page is still mapped
    t.add_(1.0)  # and usable: no segfault
    assert float(t.sum()) == 4.0 * 1024
    del t
    gc.collect()
    assert all(v == 0 for v in global_counters().values())  # the last tensor released the space
    assert tensors.release_failures() == []


def test_tensor_outlives_the_with_block():
    with host_space() as space:
        t = space.tensor((8,))
        t.fill_(2.0)
    assert space.closed
    assert float(t.sum()) == 16.0
    del t
    gc.collect()
    assert global_counters()["live_spaces"] == 0


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(32, 64)
        self.l2 = torch.nn.Linear(64, 64)
        self.l3 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


def _into_space(space, module):
    """Replace every parameter's storage with a copy placed in the space."""
    for name, p in list(module.named_parameters()):
        owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
        placed = space.tensor(p.shape, dtype=p.dtype)
        placed.copy_(p.detach())
        setattr(owner, name.rpartition(".")[2], torch.nn.Parameter(placed))


def test_mlp_forward_backward_bit_identical_to_plain_cpu():
    torch.manual_seed(0)
    plain = _MLP()
    x = torch.randn(16, 32)
    y = torch.randint(0, 10, (16,))
    with host_space(capacity=32 * MiB) as space:
        paged = _MLP()
        paged.load_state_dict(plain.state_dict())
        _into_space(space, paged)
        assert all(_allocation_of(space, p) for p in paged.parameters())
        xs = space.tensor(x.shape)
        xs.copy_(x)
        saved_in_space = []

        def pack(t):  # activations saved for backward also live in the space
            placed = space.tensor(t.shape, dtype=t.dtype)
            placed.copy_(t)
            saved_in_space.append(placed.data_ptr())
            return placed

        for step in range(3):
            loss_plain = torch.nn.functional.cross_entropy(plain(x), y)
            loss_plain.backward()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss_paged = torch.nn.functional.cross_entropy(paged(xs), y)
            loss_paged.backward()
            assert torch.equal(loss_plain, loss_paged), f"step {step}"
            for (name, a), b in zip(plain.named_parameters(), paged.parameters()):
                assert torch.equal(a.grad, b.grad), f"step {step}: grad of {name}"
            with torch.no_grad():  # SGD in place: parameters stay in the space
                for a, b in zip(plain.parameters(), paged.parameters()):
                    a -= 0.1 * a.grad
                    b -= 0.1 * b.grad
                    a.grad = b.grad = None
        assert saved_in_space, "no activation went through the space"
        assert all(_allocation_of(space, p) for p in paged.parameters())
        del paged, xs, loss_paged, a, b  # the loop variables hold the last parameters
        gc.collect()
        assert space.allocations() == []
