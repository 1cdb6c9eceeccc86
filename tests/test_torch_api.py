"""vtalloc.allocator.torch on a machine without CUDA: options, errors, statistics.

Statistics are checked for real: the shim is configured on the host backend and allocations
go through the same vta_torch_alloc PyTorch would call, so every number below was produced by
the allocator, not assumed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from helpers.subproc import run_python

import vtalloc.allocator.torch as vt
from vtalloc.allocator import BackendUnavailableError, Config, InvalidArgumentError, OutOfMemoryError
from vtalloc.allocator.torch import enabling, shim
from helpers.sizes import MiB

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")

PYTORCH_KEYS = {
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "requested_bytes.all.current",
    "requested_bytes.all.peak", "active_bytes.all.current", "reserved_bytes.all.current",
    "allocation.all.current", "allocation.all.allocated", "allocation.all.freed", "num_ooms",
    "num_device_alloc", "num_device_free",
}


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("VTALLOC_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def host_torch_shim():
    """The torch allocator's shim on the host backend, as enable() would set it up on a GPU."""
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    yield
    shim.release()


# -- options ----------------------------------------------------------------------------------

def test_options_come_from_env_and_keywords_win(clean_env):
    clean_env.setenv("VTALLOC_CAPACITY", "1GiB")
    clean_env.setenv("VTALLOC_PAGE_SIZE", "4MiB")
    cfg = vt.resolve_config()
    assert (cfg.capacity, cfg.page_size, cfg.backend) == (1 << 30, 4 * MiB, "cuda")
    assert vt.resolve_config(capacity="512MiB").capacity == 512 * MiB
    assert vt.resolve_config(capacity="512MiB").page_size == 4 * MiB


def test_device_is_not_an_option_and_its_variable_is_ignored(clean_env):
    with pytest.raises(InvalidArgumentError, match="every CUDA device"):
        vt.resolve_config(device=1)
    clean_env.setenv("VTALLOC_DEVICE", "3")
    assert vt.resolve_config().device == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"backend": "host"}, "needs the cuda backend"),
        ({"backend": "tpu"}, "backend must be one of"),
        ({"capacity": "lots"}, "cannot parse"),
        ({"capacity": -1}, "must be positive"),
        ({"page_size": 1.5}, "integer number of bytes"),
        ({"colour": "blue"}, "unknown vtalloc option"),
    ],
)
def test_bad_options_are_invalid_arguments(clean_env, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        vt.resolve_config(**kwargs)
    with pytest.raises(InvalidArgumentError, match=match):
        vt.enable(**kwargs)  # checked before anything else, CUDA or not
    assert vt.mode() is None


def test_bad_env_variable_is_an_invalid_argument(clean_env):
    clean_env.setenv("VTALLOC_CAPACITY", "12 parsecs")
    with pytest.raises(InvalidArgumentError, match="capacity"):
        vt.enable()


# -- without CUDA --------------------------------------------------------------------------------

@no_cuda
def test_enable_without_cuda_is_backend_unavailable(clean_env):
    with pytest.raises(BackendUnavailableError, match=r"torch.cuda.is_available\(\) == False"):
        vt.enable(capacity="1GiB")
    assert vt.mode() is None and not vt.is_enabled()
    assert not shim.current_config()[0]  # the shim was not touched


@no_cuda
def test_mempool_without_cuda_is_backend_unavailable(clean_env):
    with pytest.raises(BackendUnavailableError):
        vt.mempool()
    assert vt.mode() is None


def test_importing_vtalloc_does_not_import_torch():
    code = (
        "import sys, vtalloc.allocator, vtalloc.allocator.torch, vtalloc.allocator.tensors;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_oom_becomes_torch_out_of_memory_error_here():
    assert vt.oom_exception() == "torch.OutOfMemoryError"
    b = vt.oom_binding()
    assert isinstance(b, vt.OomBinding) and b.exception == "torch.OutOfMemoryError"
    assert b.route in ("constructor", "base+vtable") and b.reason == "" and "libc10.so" in b.libraries


def test_before_torch_is_imported_the_binding_says_why_and_binds_later():
    """oom_binding() reports the process as it is (it never imports torch); the shim keeps trying
    until torch is loaded; oom_exception() imports torch, as enable() does."""
    out = run_python("""
        import dataclasses, json, sys
        import vtalloc.allocator.torch as vt
        from vtalloc.allocator.torch import shim
        before = dataclasses.asdict(vt.oom_binding())
        kind = shim.exception_kind()
        thrown = dataclasses.asdict(shim.exception_selftest("vtalloc: 64 MiB"))
        imported = "torch" in sys.modules
        exception = vt.oom_exception()
        print(json.dumps({"before": before, "kind": kind, "thrown": thrown, "imported": imported,
                          "exception": exception, "after": dataclasses.asdict(vt.oom_binding())}))
    """, timeout=120)
    assert out["before"] == {"exception": "RuntimeError", "route": None, "abi": None, "libraries": [],
                             "reason": "libc10.so is not loaded (import torch first)"}
    assert out["kind"] == "std"
    assert out["thrown"] == {"type_name": "N3vta7c10_oom19OutOfMemoryFallbackE", "what": "vtalloc: 64 MiB",
                             "caught_as_oom": False, "caught_as_error": False}
    assert not out["imported"]
    assert out["exception"] == "torch.OutOfMemoryError"
    assert out["after"]["route"] in ("constructor", "base+vtable") and out["after"]["reason"] == ""


# -- statistics ----------------------------------------------------------------------------------

def test_stats_are_zero_before_any_allocation():
    s = vt.stats()
    assert s.allocated_bytes == 0 and s.capacity_bytes == 0
    m = vt.memory_stats()
    assert PYTORCH_KEYS <= m.keys()
    assert all(v == 0 for v in m.values())
    assert "no device has allocated" in vt.memory_summary()


def test_memory_stats_use_pytorch_meanings(host_torch_shim):
    small = shim.alloc_for_test(1000)            # rounded to 1024: 512-byte blocks
    large = shim.alloc_for_test(3 * MiB)         # 3 MiB, right after it: pages are shared
    m = vt.memory_stats(0)
    assert m["requested_bytes.all.current"] == 1000 + 3 * MiB
    assert m["allocated_bytes.all.current"] == 1024 + 3 * MiB
    assert m["active_bytes.all.current"] == 1024 + 3 * MiB
    assert m["reserved_bytes.all.current"] == 2 * 2 * MiB  # both touch two pages
    assert m["allocation.all.current"] == 2 and m["allocation.all.allocated"] == 2
    assert m["num_device_alloc"] >= 2 and m["vtalloc.page_bytes"] == 2 * MiB
    assert m["vtalloc.capacity_bytes"] == 16 * MiB and m["vtalloc.devices"] == 1
    assert vt.memory_allocated(0) == 1024 + 3 * MiB
    assert vt.memory_reserved() == 4 * MiB
    shim.free_for_test(large, 3 * MiB)
    m = vt.memory_stats()
    assert m["allocated_bytes.all.current"] == 1024
    assert m["allocated_bytes.all.peak"] == 1024 + 3 * MiB == vt.max_memory_allocated()
    assert m["requested_bytes.all.peak"] == 1000 + 3 * MiB
    assert m["allocation.all.freed"] == 1
    vt.reset_peak_memory_stats()
    assert vt.max_memory_allocated() == 1024
    shim.free_for_test(small, 1000)


def test_stats_sum_over_devices(host_torch_shim):
    a = shim.alloc_for_test(2 * MiB, device=0)
    b = shim.alloc_for_test(4 * MiB, device=2)
    total = vt.stats()
    assert total.allocated_bytes == 6 * MiB
    assert total.capacity_bytes == 32 * MiB  # two spaces of 16 MiB
    assert total.page_bytes == 2 * MiB  # a setting, not summed
    assert vt.stats(2).allocated_bytes == 4 * MiB
    assert vt.memory_stats("all")["vtalloc.devices"] == 2  # None: the current device, as torch
    summary = vt.memory_summary()
    assert "cuda:0" in summary and "cuda:2" in summary and "total" in summary
    assert "6 MiB" in summary  # the requested total
    shim.free_for_test(a, 0, device=0)
    shim.free_for_test(b, 0, device=2)


def test_out_of_memory_is_counted_with_numbers(host_torch_shim):
    assert shim.alloc_for_test(32 * MiB) == 0
    assert vt.memory_stats()["num_ooms"] == 1
    f = vt.failures(0)
    assert f.ooms == 1 and f.last_oom_requested_bytes == 32 * MiB and f.last_oom_capacity_bytes == 16 * MiB
    assert vt.memory_stats()["vtalloc.alloc_failures"] == 1


def test_empty_cache_gives_pages_back(host_torch_shim):
    p = shim.alloc_for_test(8 * MiB)
    shim.free_for_test(p, 8 * MiB)
    assert vt.memory_reserved() == 8 * MiB  # cached, still mapped
    assert vt.empty_cache() == 8 * MiB
    assert vt.memory_reserved() == 0


@pytest.mark.parametrize("bad", [-1, 64, 1.0, True, "0"])
def test_bad_device_is_an_invalid_argument(bad):
    for fn in (vt.stats, vt.memory_stats, vt.max_memory_allocated, vt.reset_peak_memory_stats, vt.empty_cache):
        with pytest.raises(InvalidArgumentError):
            fn(bad)


# -- record_stream -------------------------------------------------------------------------------

def test_record_stream_on_a_cuda_tensor_fails_clearly():
    class FakeCudaTensor:
        is_cuda = True

    with pytest.raises(vt.UnsupportedError, match=r"wait_stream"):
        enabling._record_stream_unsupported(FakeCudaTensor(), object())
    assert issubclass(vt.UnsupportedError, NotImplementedError)
    assert issubclass(vt.AllocatorConflictError, RuntimeError)


def test_vtalloc_errors_stay_distinct_from_torch_oom():
    # vtalloc's own OutOfMemoryError (AddressSpace API) is a MemoryError; under torch an OOM is
    # torch.OutOfMemoryError. Both carry the numbers; neither is mistaken for the other.
    assert issubclass(OutOfMemoryError, MemoryError)
    assert not issubclass(OutOfMemoryError, torch.OutOfMemoryError)


@no_cuda
def test_benchmark_exits_cleanly_without_cuda(tmp_path):
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_torch_alloc.py"
    out = tmp_path / "result-{date}.json"
    proc = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA device here" in proc.stdout and "nothing was measured" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # no numbers written
