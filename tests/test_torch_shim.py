"""The PyTorch shim's C functions, driven through ctypes on the host backend (no GPU needed).

vta_torch_alloc is called here only under the return-NULL policy: under the throw policy it
throws a C++ exception, which only a C++ caller (PyTorch) can catch. What that exception
becomes in Python is checked below: the binding to c10::OutOfMemoryError against the installed
torch and against stand-in libc10 builds of other shapes, and the whole chain into Python.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest
from helpers.subproc import run_python

from vtalloc.allocator import BackendUnavailableError, Config, InvalidArgumentError, _native
from vtalloc.allocator.torch import memory, shim
from helpers.shim_crossings import count_shim_calls
from helpers.sizes import MiB
from helpers.threads import run_threads


@pytest.fixture
def host_shim():
    """The shim configured on the host backend (16 MiB a device), released after the test."""
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    yield shim
    shim.release()


def test_spaces_are_created_per_device_on_first_use(host_shim):
    assert shim.devices() == []
    a = shim.alloc_for_test(4096, device=0)
    b = shim.alloc_for_test(3 * MiB, device=3)
    assert a and b
    assert shim.devices() == [0, 3]
    s0, s3 = shim.device_stats(0), shim.device_stats(3)
    assert (s0.num_live_allocs, s0.allocated_bytes, s0.active_bytes) == (1, 4096, 4096)
    assert (s3.num_live_allocs, s3.allocated_bytes, s3.active_bytes) == (1, 3 * MiB, 3 * MiB)
    assert shim.device_stats(1).capacity_bytes == 0  # no space, all zero
    # The pointers are real host memory of the space.
    ctypes.memmove(b, b"vtalloc" * 10, 70)
    assert ctypes.string_at(b, 70) == b"vtalloc" * 10
    shim.free_for_test(a, 4096, device=0)
    shim.free_for_test(b, 3 * MiB, device=3)
    assert shim.device_stats(0).num_live_allocs == 0 and shim.device_stats(3).num_live_allocs == 0


def test_zero_bytes_is_null_and_not_a_failure(host_shim):
    assert shim.alloc_for_test(0) == 0
    assert shim.failures(0).alloc_failures == 0
    shim.free_for_test(0, 0)  # torch never does this, but it must be harmless
    assert shim.failures(0).free_failures == 0


def test_out_of_memory_returns_null_and_keeps_the_numbers(host_shim):
    keep = shim.alloc_for_test(2 * MiB)
    assert shim.alloc_for_test(64 * MiB) == 0
    f = shim.failures(0)
    assert (f.alloc_failures, f.ooms) == (1, 1)
    assert f.last_oom_requested_bytes == 64 * MiB
    assert f.last_oom_capacity_bytes == 16 * MiB
    assert f.last_oom_mapped_bytes == 2 * MiB
    assert "CUDA out of memory (vtalloc, device 0)" in f.last_message
    assert "64.00 MiB" in f.last_message and "capacity 16.00 MiB" in f.last_message
    assert shim.device_stats(0).num_ooms == 1
    again = shim.alloc_for_test(4 * MiB)  # the space is still usable
    assert again
    shim.free_for_test(again, 4 * MiB)
    shim.free_for_test(keep, 2 * MiB)


def test_holes_are_served_as_one_allocation(host_shim):
    pages = [shim.alloc_for_test(2 * MiB) for _ in range(8)]
    assert all(pages)
    for p in pages[::2]:
        shim.free_for_test(p, 2 * MiB)
    big = shim.alloc_for_test(8 * MiB)  # no 8 MiB free range existed: pages were remapped
    assert big
    assert shim.device_stats(0).num_page_reclaims > 0
    for p in pages[1::2] + [big]:
        shim.free_for_test(p, 0)


def test_bad_frees_are_counted_never_raised(host_shim):
    live = shim.alloc_for_test(4096)
    shim.free_for_test(0xDEAD000, 16)  # not ours
    shim.free_for_test(live + 512, 16)  # interior pointer
    shim.free_for_test(live, 4096, device=5)  # a device with no space
    assert shim.failures(0).free_failures == 2
    assert "interior pointer" in shim.failures(0).last_message  # the last of the two
    assert shim.failures(5).free_failures == 1
    assert "no vtalloc address space serves device 5" in shim.failures(5).last_message
    assert shim.device_stats(0).num_live_allocs == 1  # nothing was lost
    shim.free_for_test(live, 4096)


def test_device_out_of_range_is_refused(host_shim):
    assert shim.alloc_for_test(16, device=64) == 0
    assert shim.alloc_for_test(16, device=-1) == 0
    assert shim.devices() == []
    with pytest.raises(InvalidArgumentError):
        shim.device_stats(64)
    with pytest.raises(InvalidArgumentError):
        shim.failures(-1)


def test_options_are_fixed_once_a_space_exists(host_shim):
    p = shim.alloc_for_test(4096)
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)  # same: a no-op
    with pytest.raises(InvalidArgumentError, match="already serving"):
        shim.configure(Config(backend="host", capacity=32 * MiB), shim.FAIL_RETURN_NULL)
    with pytest.raises(InvalidArgumentError, match="already serving"):
        shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_THROW)
    configured, policy, space = shim.current_config()
    assert configured and policy == shim.FAIL_RETURN_NULL and space["capacity_bytes"] == 16 * MiB
    shim.free_for_test(p, 4096)


def test_release_refuses_while_anything_is_live():
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_RETURN_NULL)
    p = shim.alloc_for_test(4096)
    with pytest.raises(InvalidArgumentError, match="1 live allocation"):
        shim.release()
    assert shim.devices() == [0]  # nothing changed
    shim.free_for_test(p, 4096)
    shim.release()
    assert shim.devices() == []
    configured, policy, _ = shim.current_config()
    assert not configured and policy == shim.FAIL_THROW  # back to the defaults


def test_peaks_reset_and_trim_gives_pages_back(host_shim):
    p = shim.alloc_for_test(6 * MiB)
    shim.free_for_test(p, 6 * MiB)
    s = shim.device_stats(0)
    assert s.peak_allocated_bytes == 6 * MiB and s.allocated_bytes == 0
    shim.reset_peak_stats()
    assert shim.device_stats(0).peak_allocated_bytes == 0
    assert shim.trim() == 6 * MiB
    assert shim.device_stats(0).pages_total == 0


def test_alloc_for_test_refuses_the_throw_policy():
    shim.configure(Config(backend="host", capacity=16 * MiB), shim.FAIL_THROW)
    try:
        with pytest.raises(InvalidArgumentError, match="return-NULL"):
            shim.alloc_for_test(16)
    finally:
        shim.release()


def test_unknown_policy_is_refused():
    with pytest.raises(InvalidArgumentError):
        shim.configure(Config(backend="host"), 7)
    assert not shim.current_config()[0]


def test_configuring_is_one_call_that_returns_what_the_shim_keeps(monkeypatch):
    """configure() crosses into the shim once: normalized, applied and read back in one call."""
    calls = count_shim_calls(monkeypatch)
    asked = Config(backend="auto", capacity=16 * MiB, device=3)
    kept = shim.configure(asked, shim.FAIL_RETURN_NULL)
    try:
        assert calls == ["vta_torch_configure"]
        assert (kept.backend, kept.device, kept.capacity) == ("cuda", 0, 16 * MiB)  # the shim's defaults applied
        assert kept == shim.normalized(asked)  # what it would keep is what it kept
        calls.clear()
        assert shim.configure(asked, shim.FAIL_RETURN_NULL) == kept and calls == ["vta_torch_configure"]  # again: same
        configured, policy, space = shim.current_config()
        assert configured and policy == shim.FAIL_RETURN_NULL and space["backend"] == _native.BACKEND_CODES["cuda"]
    finally:
        shim.release()


def test_a_refused_configure_is_one_call_and_changes_nothing(host_shim, monkeypatch):
    p = shim.alloc_for_test(4096)
    calls = count_shim_calls(monkeypatch)
    with pytest.raises(InvalidArgumentError, match="already serving"):
        shim.configure(Config(backend="host", capacity=32 * MiB), shim.FAIL_RETURN_NULL)
    assert calls == ["vta_torch_configure"]
    assert shim.current_config()[2]["capacity_bytes"] == 16 * MiB
    shim.free_for_test(p, 4096)


# -- the out-of-memory exception: c10::OutOfMemoryError bound at run time -----------------------

TORCH_LIBRARIES = ("libc10.so", "libc10_cuda.so", "libtorch_python.so", "libtorch_cpu.so", "libtorch_cuda.so")
OOM_CONSTRUCTORS = (  # c10::OutOfMemoryError(SourceLocation, std::string), C++11 and old std::string
    "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationESs",
)


def exports_oom_constructor(torch) -> bool:
    """Whether a torch library loaded here exports an OutOfMemoryError constructor, asked
    through ctypes (apart from the shim): then the shim must take the constructor route."""
    for name in TORCH_LIBRARIES:
        try:
            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", name), mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        except OSError:  # not loaded (libc10_cuda.so in a CPU build)
            continue
        if any(hasattr(lib, symbol) for symbol in OOM_CONSTRUCTORS):
            return True
    return False


def test_the_installed_torch_binds_and_says_how():
    import torch

    b = shim.oom_binding()
    assert b.reason == ""
    assert b.exception == "torch.OutOfMemoryError"
    assert b.route == ("constructor" if exports_oom_constructor(torch) else "base+vtable")
    assert b.abi == ("cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "old")
    assert b.libraries[0] == "libc10.so" and set(b.libraries) <= set(TORCH_LIBRARIES)
    assert shim.exception_kind() == "c10"


@pytest.mark.parametrize("route", [None, "constructor", "base+vtable"])
def test_the_thrown_object_is_caught_as_c10_out_of_memory_error(route):
    """Through the binding in force (None) and through each route alone: the object's dynamic
    type, its message, and what handlers for c10::OutOfMemoryError and c10::Error (torch's own
    typeinfos, asked as the C++ runtime asks them) would do with it."""
    import torch

    if route == "constructor" and not exports_oom_constructor(torch):  # torch 2.3-2.12
        with pytest.raises(BackendUnavailableError, match=r"no c10::OutOfMemoryError\(SourceLocation, std::string\) constructor"):
            shim.exception_selftest("vtalloc says: 123 bytes", route)
        return
    t = shim.exception_selftest("vtalloc says: 123 bytes", route)
    assert t.type_name == "N3c1016OutOfMemoryErrorE"  # c10::OutOfMemoryError, what torch maps to torch.OutOfMemoryError
    assert t.what.startswith("vtalloc says: 123 bytes")
    assert t.caught_as_oom and t.caught_as_error


def test_selftest_refuses_an_unknown_route():
    with pytest.raises(InvalidArgumentError, match="unknown route"):
        shim.exception_selftest("m", "vtable")
    caught = ctypes.c_int32()
    assert shim.lib().vta_torch_exception_selftest(b"m", 3, None, 0, None, 0, ctypes.byref(caught)) == 1
    assert "unknown route 3" in shim.lib().vta_torch_last_error().decode()


FAKE_C10 = os.path.join(os.path.dirname(__file__), "helpers", "fake_c10.cpp")


def binding_with_fake_c10(tmp_path, *flags: str) -> dict:
    """oom_binding() and the selftest in a fresh process where a stand-in libc10.so
    (tests/helpers/fake_c10.cpp built with `flags`) is loaded instead of torch."""
    lib = tmp_path / "libc10.so"
    subprocess.run([shutil.which("c++") or "g++", "-std=c++17", "-shared", "-fPIC", "-O1", *flags,
                    "-Wl,-soname,libc10.so", "-o", str(lib), FAKE_C10], check=True, timeout=120)
    return run_python("""
        import ctypes, dataclasses, json, sys
        from vtalloc.allocator import BackendUnavailableError
        from vtalloc.allocator.torch import shim
        ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
        forced = {}
        for route in ("constructor", "base+vtable"):
            try:
                forced[route] = dataclasses.asdict(shim.exception_selftest("vtalloc: forced", route))
            except BackendUnavailableError as e:
                forced[route] = str(e)
        print(json.dumps({"binding": dataclasses.asdict(shim.oom_binding()), "torch": "torch" in sys.modules,
                          "thrown": dataclasses.asdict(shim.exception_selftest("vtalloc: 64 MiB")), "forced": forced}))
    """, str(lib), timeout=120)


@pytest.mark.parametrize("abi, flags", [("cxx11", []), ("old", ["-D_GLIBCXX_USE_CXX11_ABI=0"])])
def test_without_an_exported_constructor_the_base_and_vtable_route_binds(tmp_path, abi, flags):
    """The shape of torch 2.3-2.12 (2.3-2.6 with the old std::string): c10::Error's constructor and
    OutOfMemoryError's vtable, no OutOfMemoryError constructor. The message and the source
    location must arrive whole in either std::string ABI."""
    out = binding_with_fake_c10(tmp_path, *flags)
    assert not out["torch"]
    assert out["binding"] == {"exception": "torch.OutOfMemoryError", "route": "base+vtable", "abi": abi,
                              "libraries": ["libc10.so"], "reason": ""}
    caught = {"type_name": "N3c1016OutOfMemoryErrorE", "caught_as_oom": True, "caught_as_error": True}
    assert out["thrown"] == {**caught, "what": "vtalloc: 64 MiB @vta_torch_alloc"}
    assert out["forced"]["base+vtable"] == {**caught, "what": "vtalloc: forced @vta_torch_alloc"}
    assert "no c10::OutOfMemoryError(SourceLocation, std::string) constructor" in out["forced"]["constructor"]


def test_an_out_of_memory_error_with_a_second_base_is_refused(tmp_path):
    """Installing the vtable is only right for a class that adds nothing to c10::Error: a second base
    (another subobject) fails the typeinfo check, and the fallback is thrown instead."""
    out = binding_with_fake_c10(tmp_path, "-DFAKE_SECOND_BASE")
    b = out["binding"]
    assert (b["exception"], b["route"], b["abi"], b["libraries"]) == ("RuntimeError", None, None, [])
    assert "does not say it derives from c10::Error alone" in b["reason"] and "searched libc10.so" in b["reason"]
    assert out["thrown"] == {"type_name": "N3vta7c10_oom19OutOfMemoryFallbackE", "what": "vtalloc: 64 MiB",
                             "caught_as_oom": False, "caught_as_error": False}
    assert "derives from c10::Error alone" in out["forced"]["base+vtable"]


def test_a_libc10_without_out_of_memory_error_says_what_is_missing(tmp_path):
    b = binding_with_fake_c10(tmp_path, "-DFAKE_NO_OOM")["binding"]
    assert b["exception"] == "RuntimeError" and b["route"] is None
    assert b["reason"] == ("no c10::OutOfMemoryError(SourceLocation, std::string) constructor is exported; "
                           "no c10::OutOfMemoryError vtable is exported (searched libc10.so)")


@pytest.mark.slow
def test_exception_reaches_python_as_torch_out_of_memory_error():
    """A C++ caller (as PyTorch's allocator is) gets the shim's exception; torch's translation makes it
    torch.OutOfMemoryError carrying vtalloc's numbers. Compiles a small torch extension (g++ and
    ninja), measured cold on 2 cores: 25-37 s with torch 2.13 CPU, 28-49 s with 2.11+cu130, 20-26 s
    with 2.6.0+cu124; 2-3 s once torch's extension cache (~/.cache/torch_extensions) holds it."""
    import torch
    import torch.utils.cpp_extension as cpp

    source = r"""
    #include <torch/extension.h>
    typedef void* (*AllocFn)(size_t, int, void*);
    int64_t call_alloc(int64_t fn, int64_t size) { return (int64_t)((AllocFn)fn)((size_t)size, 0, nullptr); }
    """
    ext = cpp.load_inline("vtalloc_shim_caller", cpp_sources=source, functions=["call_alloc"])
    fn = ctypes.cast(shim.lib().vta_torch_alloc, ctypes.c_void_p).value
    shim.configure(Config(backend="host", capacity=8 * MiB), shim.FAIL_THROW)
    try:
        p = ext.call_alloc(fn, 4096)
        assert p
        with pytest.raises(torch.OutOfMemoryError, match=r"vtalloc.*64\.00 MiB.*capacity 8\.00 MiB"):
            ext.call_alloc(fn, 64 * MiB)
        shim.free_for_test(p, 4096)
    finally:
        shim.release()


def test_threads_race_to_create_spaces_and_allocate(host_shim):
    import threading

    errors: list[str] = []
    barrier = threading.Barrier(8)

    def work(seed: int) -> None:
        barrier.wait()  # every thread starts while no space exists yet
        for i in range(200):
            device = (seed + i) % 4
            size = 512 * (1 + (seed * 7 + i) % 16)
            p = shim.alloc_for_test(size, device=device)  # ctypes releases the GIL: real concurrency
            if not p:
                errors.append(shim.failures(device).last_message)
                continue
            ctypes.memset(p, seed, size)
            if ctypes.string_at(p, size) != bytes([seed]) * size:
                errors.append(f"thread {seed}: bytes changed under it")
            shim.free_for_test(p, size, device=device)

    assert run_threads(work, [(s,) for s in range(8)]) == []
    assert errors == []
    assert shim.devices() == [0, 1, 2, 3]
    stats = [shim.device_stats(d) for d in range(4)]
    assert sum(s.num_allocs for s in stats) == 8 * 200
    assert all(s.num_live_allocs == 0 for s in stats)
    assert all(shim.failures(d).free_failures == 0 for d in range(4))


def test_residency_calls_on_the_shims_spaces(host_shim):
    """The eviction engine behind torch's allocator, driven by address (paged_activations on CUDA)."""
    a = shim.alloc_for_test(4 * MiB)
    with pytest.raises(InvalidArgumentError):  # the space of device 1 does not exist yet
        shim.residency_op(1, shim.OP_OFFLOAD, a)
    assert shim.residency_op(0, shim.OP_RESIDENCY, a) == "resident"
    shim.residency_op(0, shim.OP_SET_EVICTABLE, a)
    shim.residency_op(0, shim.OP_OFFLOAD, a)
    assert shim.residency_op(0, shim.OP_RESIDENCY, a) in ("evicted", "in_flight")
    shim.residency_op(0, shim.OP_ENSURE_RESIDENT, a)
    assert shim.residency_op(0, shim.OP_RESIDENCY, a) == "resident"
    st = shim.device_stats(0)
    assert st.evictions == 2 and st.restores == 2 and st.evict_mode in ("mapped", "copy")
    with pytest.raises(InvalidArgumentError):
        shim.residency_op(0, shim.OP_OFFLOAD, a + 512)  # not the start of an allocation
    with pytest.raises(InvalidArgumentError):
        shim.residency_op(0, 99, a)
    # offload_bytes reports what moved: all of a; then of c, only the page it does not share with
    # b, which is not evictable (paged_activations counts this, and offloads c again later).
    assert shim.offload_bytes(0, a) == 4 * MiB
    shim.residency_op(0, shim.OP_ENSURE_RESIDENT, a)
    c = shim.alloc_for_test(3 * MiB)
    b = shim.alloc_for_test(3 * MiB)
    assert b == c + 3 * MiB and c % (2 * MiB) == 0
    assert shim.offload_bytes(0, c) == 2 * MiB
    with pytest.raises(InvalidArgumentError):
        shim.offload_bytes(0, c + 512)
    with pytest.raises(InvalidArgumentError):
        shim.offload_bytes(1, c)  # no space there
    shim.residency_op(0, shim.OP_ENSURE_RESIDENT, c)
    for p in (a, b, c):
        shim.free_for_test(p, 3 * MiB if p != a else 4 * MiB)


def test_paged_activations_without_a_space_needs_enable():
    from vtalloc.allocator.torch import paged_activations

    with pytest.raises(InvalidArgumentError):
        paged_activations()


def test_torch_spaces_are_published_for_stats_pid(host_shim, tmp_path, monkeypatch):
    import vtalloc.allocator.torch as vt
    from vtalloc.allocator import publish

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    a = shim.alloc_for_test(3 * MiB)
    vt.publish_stats(interval_s=0.05)
    import time

    deadline = time.monotonic() + 5
    record = None
    while time.monotonic() < deadline:
        try:
            record = publish.read_published(os.getpid())
            if record["spaces"][0]["stats"]["allocated_bytes"] == 3 * MiB:
                break
        except (FileNotFoundError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.05)
    assert record is not None and record["spaces"][0]["name"] == "torch:cuda:0"  # one row per device
    assert record["spaces"][0]["stats"]["allocated_bytes"] == 3 * MiB
    publish.unpublish_stats(memory.TORCH_VIEW)
    shim.free_for_test(a, 3 * MiB)
