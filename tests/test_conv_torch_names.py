"""PyTorch's names and device arguments in vtalloc.allocator.torch, with torch's semantics.

Checked on the host backend through the same vta_torch_alloc PyTorch would call (as
test_torch_api.py does): every number comes from the allocator.
"""

from __future__ import annotations

import pytest
import torch
from helpers.sizes import MiB

import vtalloc.allocator.torch as vt
from vtalloc.allocator import Config, InvalidArgumentError
from vtalloc.allocator.torch import enabling, shim


@pytest.fixture
def host_torch_shim():
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    yield
    shim.release()


@pytest.mark.parametrize("device", [0, "cuda:0", "cuda", torch.device("cuda:0"), torch.device("cuda"), None])
def test_device_arguments_name_device_zero(host_torch_shim, device):
    p = shim.alloc_for_test(2 * MiB, device=0)
    q = shim.alloc_for_test(4 * MiB, device=1)
    assert vt.memory_allocated(device) == 2 * MiB
    assert vt.max_memory_reserved(device) == 2 * MiB
    assert vt.stats(device).allocated_bytes == 2 * MiB
    shim.free_for_test(p, 0, device=0)
    shim.free_for_test(q, 0, device=1)


def test_other_ordinals_by_any_name(host_torch_shim):
    q = shim.alloc_for_test(4 * MiB, device=1)
    for device in (1, "cuda:1", torch.device("cuda", 1)):
        assert vt.memory_allocated(device) == 4 * MiB
    assert vt.memory_allocated(None) == 0  # the current device is 0 (CUDA is not initialized)
    assert vt.memory_allocated("all") == 4 * MiB
    shim.free_for_test(q, 0, device=1)


@pytest.mark.parametrize("bad", ["cpu", "cuda:x", "gpu0", torch.device("cpu"), torch.device("meta"), 2.0, [0], -1,
                                 "cuda:64", True])
def test_bad_device_arguments_are_typed_errors(bad):
    for fn in (vt.memory_stats, vt.max_memory_reserved, vt.reset_max_memory_allocated,
               vt.reset_accumulated_memory_stats, vt.memory_stats_as_nested_dict, vt.mem_get_info):
        with pytest.raises(InvalidArgumentError, match="device"):
            fn(bad)


def test_max_memory_reserved_is_the_peak_of_pages_held(host_torch_shim):
    big = shim.alloc_for_test(8 * MiB)
    shim.free_for_test(big, 8 * MiB)
    assert vt.empty_cache() == 8 * MiB
    assert vt.memory_reserved() == 0
    assert vt.max_memory_reserved() == 8 * MiB  # torch: reserved_bytes.all.peak
    assert vt.memory_stats()["reserved_bytes.all.peak"] == 8 * MiB
    vt.reset_peak_memory_stats()
    assert vt.max_memory_reserved() == 0


def test_reset_max_memory_allocated_resets_every_peak_as_torch_does(host_torch_shim):
    a = shim.alloc_for_test(6 * MiB)
    shim.free_for_test(a, 6 * MiB)
    small = shim.alloc_for_test(2 * MiB)
    assert vt.max_memory_allocated() == 6 * MiB
    vt.reset_max_memory_allocated("cuda:0")
    assert vt.max_memory_allocated() == 2 * MiB
    assert vt.memory_stats()["requested_bytes.all.peak"] == 2 * MiB
    assert vt.max_memory_reserved() == vt.memory_reserved()  # every peak, as torch's
    shim.free_for_test(small, 2 * MiB)


def test_reset_accumulated_memory_stats_restarts_counts_not_state(host_torch_shim):
    a = shim.alloc_for_test(2 * MiB)
    b = shim.alloc_for_test(2 * MiB)
    shim.free_for_test(a, 2 * MiB)
    assert shim.alloc_for_test(64 * MiB) == 0  # an OOM
    before = vt.memory_stats()
    assert before["allocation.all.allocated"] == 2 and before["num_ooms"] == 1
    vt.reset_accumulated_memory_stats(torch.device("cuda:0"))
    m = vt.memory_stats()
    assert (m["allocation.all.allocated"], m["allocation.all.freed"], m["num_ooms"], m["num_device_alloc"]) == (0, 0, 0, 0)
    assert m["allocation.all.current"] == 1 and m["allocated_bytes.all.current"] == 2 * MiB  # state is kept
    assert m["allocated_bytes.all.peak"] == before["allocated_bytes.all.peak"]  # peaks are not accumulated
    shim.free_for_test(b, 2 * MiB)
    assert vt.memory_stats()["allocation.all.freed"] == 1  # counts again from the reset
    assert vt.stats().num_frees == 2  # vtalloc's own counters are untouched


def test_accumulated_reset_is_forgotten_with_the_spaces():
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    shim.free_for_test(shim.alloc_for_test(2 * MiB), 2 * MiB)
    vt.reset_accumulated_memory_stats()
    shim.release()
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    try:
        p = shim.alloc_for_test(2 * MiB)
        assert vt.memory_stats()["allocation.all.allocated"] == 1  # not 1 - 1
        shim.free_for_test(p, 2 * MiB)
    finally:
        shim.release()


def test_nested_dict_is_memory_stats_unflattened(host_torch_shim):
    p = shim.alloc_for_test(3 * MiB)
    flat, nested = vt.memory_stats(), vt.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == 3 * MiB  # whole 512-byte blocks
    assert nested["num_ooms"] == 0 and nested["vtalloc"]["mapped_bytes"]["peak"] == flat["vtalloc.mapped_bytes.peak"]

    def flatten(d, prefix=""):
        for k, v in d.items():
            yield from flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [(prefix + k, v)]

    assert dict(flatten(nested)) == flat
    shim.free_for_test(p, 3 * MiB)


def test_mem_get_info_is_free_and_total_of_the_space(host_torch_shim):
    assert vt.mem_get_info() == (16 * MiB, 16 * MiB)  # before the space exists: the configured capacity
    p = shim.alloc_for_test(5 * MiB)  # three pages
    assert vt.mem_get_info("cuda:0") == (10 * MiB, 16 * MiB)
    shim.free_for_test(p, 5 * MiB)
    assert vt.mem_get_info(0) == (10 * MiB, 16 * MiB)  # cached pages are held: not free, as in torch
    vt.empty_cache()
    assert vt.mem_get_info() == (16 * MiB, 16 * MiB)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without CUDA")
def test_mem_get_info_without_a_configuration_or_cuda_is_zero():
    assert vt.mem_get_info() == (0, 0)


def test_mempool_on_a_torch_without_mempool_is_unsupported_and_says_the_version(monkeypatch):
    """pyproject's torch extra admits torch 2.3 (enable() works there) and every newer one (no cap:
    a torch newer than the native binding's falls back to the pluggable binding); mempool() needs
    torch.cuda.MemPool (2.5)."""
    import tomllib
    import types
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert not [r for r in project["dependencies"] if r.startswith("torch")]
    assert project["optional-dependencies"]["torch"] == ["torch>=2.3"]
    old_torch = types.SimpleNamespace(__version__="2.4.1", cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setattr(enabling, "_torch", lambda: old_torch)
    with pytest.raises(vt.UnsupportedError, match=r"MemPool, new in PyTorch 2.5; this is PyTorch 2.4.1.*enable\(\)"):
        vt.mempool(capacity="1GiB")
    assert vt.mode() is None and not shim.current_config()[0]  # nothing changed
