"""Regions with PyTorch on CPU: vtalloc.allocator.torch.region / pause / resume over the shim's
spaces on the host backend (the same vta_torch_alloc and vta_torch_malloc PyTorch calls under
enable(), graph-private pools included), and a model's weights paused while another model trains
in the memory they left, over a host space's tensors (docs/regions.md; the GPU forms are
tests/test_regions_gpu.py)."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch
from helpers.sizes import MiB
from helpers.spaces import host_space, pattern

import vtalloc.allocator.torch as vt
from vtalloc.allocator import Config, InvalidArgumentError, OutOfMemoryError
from vtalloc.allocator.torch import native_abi as native
from vtalloc.allocator.torch import shim


@pytest.fixture
def host_shim():
    shim.configure(Config(backend="host", capacity=16 * MiB, host_capacity=64 * MiB), shim.FAIL_RETURN_NULL)
    yield
    shim.release()


def write(address: int, data: bytes) -> None:
    ctypes.memmove(address, data, len(data))


def test_tensors_made_in_a_region_are_paused_their_memory_used_and_resumed_with_their_bytes(host_shim):
    with vt.region("weights"):
        w = shim.alloc_for_test(10 * MiB)
        graph = native.malloc(2 * MiB + 512)  # the torch-native binding's path reads the same tag
    activation = shim.alloc_for_test(1 * MiB)
    write(w, pattern(1, 10 * MiB))
    write(graph, pattern(2, 2 * MiB + 512))
    assert vt.regions(0)[0].allocations == 2
    assert shim.alloc_for_test(14 * MiB) == 0  # no room while the region is resident
    freed = vt.pause("weights")
    assert freed >= 12 * MiB
    big = shim.alloc_for_test(14 * MiB)
    assert big  # the region's memory serves another tensor now
    write(big, pattern(3, 14 * MiB))
    with pytest.raises(OutOfMemoryError, match="resume\\('weights'\\) found no room"):
        vt.resume("weights")
    shim.free_for_test(big, 14 * MiB)
    assert vt.resume("weights") == freed
    assert ctypes.string_at(w, 10 * MiB) == pattern(1, 10 * MiB)
    assert ctypes.string_at(graph, 2 * MiB + 512) == pattern(2, 2 * MiB + 512)
    row = vt.regions(0)[0]
    assert (row.tag, row.pauses, row.resumes, row.paused_bytes) == ("weights", 1, 1, 0)
    shim.free_for_test(w, 10 * MiB)
    native.free(graph)
    shim.free_for_test(activation, 1 * MiB)


def test_a_graph_pools_kept_blocks_are_paused_with_their_region_and_not_reused_until_resumed(host_shim):
    """A CUDA graph captured inside a region: its private pool's blocks carry the tag, freed ones
    (kept for the graph's replays) included; while paused, the pool takes none of them back."""
    pool = native.PoolId(3, 4)
    native.pool_incref(0, pool)
    with vt.region("graph"):
        kept = native.malloc(4 * MiB, pool=pool)
        live = native.malloc(4 * MiB, pool=pool)
    write(kept, pattern(4, 4 * MiB))
    write(live, pattern(5, 4 * MiB))
    native.free(kept)  # kept for the graph: its bytes must survive a pause
    assert [b.state for b in native.blocks(0, pool)].count("pool_cached") == 1
    vt.pause("graph")
    other = native.malloc(4 * MiB, pool=pool)  # not the kept block: it is paused
    assert other not in (kept, live)
    native.free(other)
    vt.resume("graph")
    assert ctypes.string_at(kept, 4 * MiB) == pattern(4, 4 * MiB)
    assert ctypes.string_at(live, 4 * MiB) == pattern(5, 4 * MiB)
    again = native.malloc(4 * MiB, pool=pool)
    assert again == kept  # resumed, the pool takes its kept block back
    for p in (again, live):
        native.free(p)
    native.pool_release(0, pool)


def test_the_torch_tag_is_per_thread_and_restored_after_the_block(host_shim):
    seen = {}
    with vt.region("outer"):
        with vt.region("inner"):
            inner = shim.alloc_for_test(4096)
            t = threading.Thread(target=lambda: seen.setdefault("other", shim.alloc_for_test(4096)))
            t.start()
            t.join()
        outer = shim.alloc_for_test(4096)
    untagged = shim.alloc_for_test(4096)
    assert {r.tag: r.allocations for r in vt.regions(0)} == {"inner": 1, "outer": 1}
    for p in (inner, outer, untagged, seen["other"]):
        shim.free_for_test(p, 4096)


def test_regions_need_the_shim_configured_and_good_arguments():
    with pytest.raises(InvalidArgumentError, match="enable\\(\\) first"):
        vt.pause("weights")
    with pytest.raises(InvalidArgumentError, match="enable\\(\\) first"):
        with vt.region("weights"):
            pass
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    try:
        with pytest.raises(InvalidArgumentError):
            vt.pause("bad tag")
        with pytest.raises(InvalidArgumentError):
            vt.resume("weights", device=64)
        with pytest.raises(InvalidArgumentError):
            vt.resume("weights", timeout=-1)
        with pytest.raises(InvalidArgumentError):
            vt.regions(-1)
        assert vt.pause("weights") == 0 and vt.resume("weights") == 0  # no space yet: nothing
    finally:
        shim.release()


def _linear_in(space, module: torch.nn.Linear) -> None:
    """The module's parameters moved into tensors of ``space`` (same values)."""
    for p in module.parameters():
        t = space.tensor(tuple(p.shape))
        t.copy_(p.detach())
        p.data = t


def test_a_models_weights_paused_while_another_trains_in_their_memory_give_the_same_outputs_after_resume():
    """The RL colocation step on CPU: the "policy" (24 MiB of weights) is paused; the "trainer"'s
    weights (24 MiB) only fit in the memory it left; after the trainer's steps and its tensors'
    death, the policy resumes and answers bit for bit as before."""
    torch.manual_seed(0)
    x = torch.randn(8, 1024)
    with host_space(32 * MiB, host_capacity=64 * MiB) as space:
        with space.region("policy"):
            policy = torch.nn.Sequential(*[torch.nn.Linear(1024, 2048, bias=False),
                                           torch.nn.Linear(2048, 1024, bias=False),
                                           torch.nn.Linear(1024, 2048, bias=False)])
            for m in policy:
                _linear_in(space, m)
        with torch.no_grad():
            before = policy(x).clone()
        with pytest.raises(OutOfMemoryError):
            space.tensor((3, 2048, 1024))  # the trainer does not fit beside the policy
        space.pause("policy", discard=False)
        trainer = torch.nn.Sequential(*[torch.nn.Linear(1024, 2048, bias=False), torch.nn.Linear(2048, 1024, bias=False),
                                        torch.nn.Linear(1024, 2048, bias=False)])
        for m in trainer:
            _linear_in(space, m)
        opt = torch.optim.SGD(trainer.parameters(), lr=0.01)
        for _ in range(3):
            opt.zero_grad()
            trainer(x).square().mean().backward()
            opt.step()
        del trainer, opt, m
        space.resume("policy")
        with torch.no_grad():
            after = policy(x)
        assert torch.equal(before, after)
        del policy
