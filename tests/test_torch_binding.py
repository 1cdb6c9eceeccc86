"""The torch-native binding on a machine without a GPU: its source compiles against the installed
torch's headers into a library that formats no number through a C++ stream, and enable()'s choice of binding (auto / native / pluggable),
its fallback warning, the build cache and vt.binding() behave as docs/torch.md says. The build
and load steps are faked where they would need CUDA libraries.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from helpers.shim_crossings import count_shim_calls
from helpers.subproc import run_python

import vtalloc.allocator.torch as vt
from vtalloc.allocator import _native
from vtalloc.allocator.torch import binding_build as _torch_binding, binding_choice as _torch_install, enabling, shim as _torch_shim
from vtalloc.allocator.torch.process_mode import state
from vtalloc.allocator.errors import BackendUnavailableError, InvalidArgumentError


def fake_torch(version: str = "2.13.0+cu130", cuda: str | None = "13.0") -> types.SimpleNamespace:
    """What build() reads of torch: version, CUDA version, where its headers are, the C++ ABI."""
    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda),
                                 __file__=torch.__file__, _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True))


@pytest.fixture
def fake_compiler(tmp_path: Path) -> Path:
    """A "compiler" that writes its -o file and counts its runs in calls.txt."""
    script = tmp_path / "fake-cxx"
    script.write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
open({str(tmp_path / 'calls.txt')!r}, "a").write("x\\n")
out = args[args.index("-o") + 1]
open(out, "w").write("not really a library")
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture
def build_env(tmp_path: Path, fake_compiler: Path) -> dict[str, str]:
    return {"CXX": str(fake_compiler), "VTALLOC_CACHE_DIR": str(tmp_path / "cache"), "PATH": os.environ["PATH"],
            "CUDA_HOME": str(_cuda_home(tmp_path))}


def _cuda_home(tmp_path: Path) -> Path:
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda_runtime_api.h").write_text("/* found */\n")
    return home


@pytest.fixture
def fresh_warning():
    _torch_install.reset_warning_for_tests()
    yield
    _torch_install.reset_warning_for_tests()


# -- the source compiles -------------------------------------------------------------------------

def _compile_check_or_skip(**kw):
    if not _torch_binding.cuda_include_dirs():
        pytest.skip("no CUDA headers (cuda_runtime_api.h) in $CUDA_HOME, /usr/local/cuda or pip nvidia-* packages")
    return _torch_binding.compile_check(torch, **kw)


def test_binding_compiles_against_installed_torch_and_formats_no_number_through_a_stream():
    """The binding as build() compiles it (-O2, torch's and CUDA's headers) writes no number into
    a C++ stream, imported or instantiated: on the H200 of 2026-11-28 the one in its OOM message
    (TORCH_CHECK_WITH -> c10::str<..., int, ...> -> ostream::_M_insert<long>) was a SIGSEGV at
    every out-of-memory. The sources before the fix fail here (ostream::_M_insert<double>,
    _M_insert<unsigned long>, operator<<(int))."""
    result = _compile_check_or_skip()
    assert result.returncode == 0, f"{' '.join(result.command)}\n{result.output[-4000:]}"
    assert result.number_formatting == (), result.number_formatting
    assert result.ok and "-O2" in result.command and "-DNDEBUG" in result.command


def test_compile_check_catches_a_number_formatted_through_torch_check(monkeypatch, tmp_path):
    """The check is not vacuous: one TORCH_CHECK with a number in a binding source is caught."""
    if not _torch_binding.cuda_include_dirs():
        pytest.skip("no CUDA headers found")
    (tmp_path / "torch_binding").mkdir()
    (tmp_path / "torch_binding" / "formats.cpp").write_text(
        '#include <c10/util/Exception.h>\nvoid vta_check_size(int n) { TORCH_CHECK(n > 0, "bad size ", n); }\n')
    monkeypatch.setattr(_torch_binding, "_source_root", lambda: tmp_path)
    result = _torch_binding.compile_check(torch)
    assert result.returncode == 0, result.output[-4000:]
    assert not result.ok and result.number_formatting
    assert any("_ZNSolsEi" in s or "_M_insert" in s for s in result.number_formatting), result.number_formatting


def test_compile_check_reports_a_compile_error(monkeypatch, tmp_path):
    if not _torch_binding.cuda_include_dirs():
        pytest.skip("no CUDA headers found")
    bad = tmp_path / "torch_binding"
    bad.mkdir()
    (bad / "broken.cpp").write_text("int main() { return undeclared_name; }\n")
    monkeypatch.setattr(_torch_binding, "_source_root", lambda: tmp_path)
    result = _torch_binding.compile_check(torch)
    assert not result.ok and result.returncode != 0
    assert "undeclared_name" in result.output


# What formats through a stream in torch's headers: the binding's own sources use none of it
# (csrc/torch_binding/raise.hpp builds messages with snprintf and throws torch's types).
STREAM_FORMATTING_IN_SOURCE = re.compile(
    r"\b(TORCH_CHECK\w*|TORCH_WARN\w*|TORCH_INTERNAL_ASSERT\w*|C10_THROW_ERROR|AT_ERROR|c10::str|std::(o|i)?stringstream|"
    r"std::cout|std::cerr|std::ostream)\b|#include\s*<(sstream|iostream|ostream|fstream|iomanip|locale)>|<<\s*\w")


def test_binding_sources_use_no_stream_formatting():
    offending = []
    for f in _torch_binding.source_files():
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("//", 1)[0]
            if STREAM_FORMATTING_IN_SOURCE.search(code) and "uint64_t{1} <<" not in code:
                offending.append(f"{f.name}:{n}: {line.strip()}")
    assert offending == [], "the binding must not format through iostreams (csrc/torch_binding/raise.hpp):\n" + \
        "\n".join(offending)


def test_loading_the_binding_makes_the_processs_cxx_runtime_global():
    """The mechanism of the crash of 2026-11-28: torch loads libstdc++ into a local scope, and a
    library loaded with RTLD_LOCAL resolves its own references to libstdc++'s templates to its
    own weak copies first (on the H200 image the built binding carried num_put's members and the
    guard of its facet id; with the binding of 63cd8d0 an OOM was a SIGSEGV, and the same library
    loaded after libstdc++ was made global raised torch.OutOfMemoryError: BENCHMARKS.md). Before
    the binding is loaded, libstdc++ is made global. Shown first with libstdc++ loaded locally, as
    Python's extension loading does (torch's CPU wheels leave it so; the CUDA wheels of torch 2.15
    already make it global through their global dependencies), then with torch itself."""
    out = run_python("""
        import ctypes, json, os
        from vtalloc.allocator.torch import binding_build
        ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_LOCAL)
        before = hasattr(ctypes.CDLL(None), "_ZNSt6localeC1Ev")
        shared = binding_build.share_cxx_runtime()
        after = hasattr(ctypes.CDLL(None), "_ZNSt6localeC1Ev")
        print(json.dumps({"before": before, "shared": shared, "after": after}))
    """)
    assert out == {"before": False, "shared": "libstdc++.so.6", "after": True}
    out = run_python("""
        import ctypes, json
        import torch
        from vtalloc.allocator.torch import binding_build
        shared = binding_build.share_cxx_runtime()
        print(json.dumps({"shared": shared, "after": hasattr(ctypes.CDLL(None), "_ZNSt6localeC1Ev")}))
    """)
    assert out == {"shared": "libstdc++.so.6", "after": True}


def test_a_binding_with_stream_code_is_not_loaded_without_the_shared_runtime(monkeypatch, tmp_path):
    """Where the runtime cannot be made global, a library that formats numbers through streams is
    refused (kind stream-formatting: enable() falls back to pluggable); one that formats none loads."""
    monkeypatch.setattr(_torch_binding, "share_cxx_runtime", lambda: None)
    monkeypatch.setattr(_torch_binding, "number_formatting_symbols", lambda path: ("_ZNSo9_M_insertIlEERSoT_",))
    with pytest.raises(_torch_binding.BindingBuildError) as info:
        _torch_binding.load(tmp_path / "torch_binding-x.so")
    assert info.value.failure.kind == "stream-formatting" and "_M_insert" in str(info.value)
    monkeypatch.setattr(_torch_binding, "number_formatting_symbols", lambda path: ())
    with pytest.raises(_torch_binding.BindingBuildError) as info:  # nothing to refuse: the load itself fails
        _torch_binding.load(tmp_path / "torch_binding-x.so")
    assert info.value.failure.kind == "load-error"


def test_core_library_does_not_compile_the_binding():
    setup = (Path(__file__).parent.parent / "setup.py").read_text()
    assert '"torch_binding"' in setup and "EXCLUDED" in setup
    lib = _torch_shim.lib()
    assert not hasattr(lib, "vta_torch_binding_install")


# -- typed failures ------------------------------------------------------------------------------

def test_no_compiler_is_a_typed_failure(build_env):
    env = dict(build_env, CXX="/nonexistent/c++")
    with pytest.raises(_torch_binding.BindingBuildError) as info:
        _torch_binding.build(fake_torch(), env)
    assert info.value.failure.kind == "no-compiler"
    assert "/nonexistent/c++" in str(info.value)
    assert isinstance(info.value, BackendUnavailableError)


def test_no_cuda_headers_is_a_typed_failure(build_env, monkeypatch):
    monkeypatch.setattr(_torch_binding, "cuda_include_dirs", lambda environ=None, cuda_version=None: [])
    with pytest.raises(_torch_binding.BindingBuildError) as info:
        _torch_binding.build(fake_torch(), build_env)
    assert info.value.failure.kind == "no-cuda-headers"
    assert "CUDA_HOME" in info.value.failure.detail


@pytest.mark.parametrize("version,cuda", [("2.10.1+cu128", "12.8"), ("2.16.0", "13.2"), ("3.0.0+cu140", "14.0"),
                                          ("2.13.0+cpu", None)])
def test_unsupported_torch_is_a_typed_failure(build_env, version, cuda):
    with pytest.raises(_torch_binding.BindingBuildError) as info:
        _torch_binding.build(fake_torch(version, cuda), build_env)
    assert info.value.failure.kind == "unsupported-torch"
    assert version in info.value.failure.detail


@pytest.mark.parametrize("version,std", [("2.11.0+cu130", "-std=c++17"), ("2.13.0+cu130", "-std=c++17"),
                                         ("2.14.1+cu130", "-std=c++20"), ("2.15.0+cu132", "-std=c++20")])
def test_checked_torch_versions_build_with_the_standard_their_headers_need(build_env, version, std):
    """2.14 and 2.15 are built (their C++20 headers refused -std=c++17: std::strong_ordering)."""
    path, seconds = _torch_binding.build(fake_torch(version), build_env)
    assert path.exists() and seconds != "cached"
    assert _torch_binding.cxx_standard(fake_torch(version)) == std


def test_a_torch_newer_than_the_checked_ones_falls_back_with_one_warning_saying_why(build_env, fresh_warning):
    """torch 2.16 is not refused at install (no cap in the requirements): enable()'s "auto" takes the
    pluggable binding, warning once that the native one was not checked against this torch."""
    newer = fake_torch("2.16.0+cu132", "13.2")
    with pytest.warns(vt.BindingFallbackWarning) as record:
        chosen, lib = _torch_install.prepare(newer, "auto", build=lambda t: _torch_binding.build(t, build_env))
        again, _ = _torch_install.prepare(newer, "auto", build=lambda t: _torch_binding.build(t, build_env))
    assert len(record) == 1 and "newer than the versions" in str(record[0].message)
    assert chosen.kind == again.kind == "pluggable" and lib is None
    assert chosen.reason.startswith("unsupported-torch: torch 2.16.0+cu132 is newer")


def test_compile_error_carries_the_compiler_output_tail(build_env, tmp_path):
    failing = tmp_path / "failing-cxx"
    failing.write_text("#!/bin/sh\necho 'vta_allocator.cpp:1: error: something precise' >&2\nexit 1\n")
    failing.chmod(0o755)
    with pytest.raises(_torch_binding.BindingBuildError) as info:
        _torch_binding.build(fake_torch(), dict(build_env, CXX=str(failing)))
    assert info.value.failure.kind == "compile-error"
    assert "something precise" in info.value.failure.detail
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written is left to load


def test_load_error_is_a_typed_failure(build_env):
    path, _ = _torch_binding.build(fake_torch(), build_env)  # the fake compiler writes a text file
    with pytest.raises(_torch_binding.BindingBuildError) as info:
        _torch_binding.load(path)
    # on a branch whose core lacks the torch-native ABI it is refused before loading
    assert info.value.failure.kind in ("load-error", "abi-mismatch")


# -- the cache -----------------------------------------------------------------------------------

def test_cache_key_changes_with_every_input():
    base = ("2.13.0+cu130", "13.0", 1, "src", "core")
    keys = {_torch_binding.cache_key(*base)}
    for i, other in enumerate(["2.11.0+cu130", "12.8", 0, "src2", "core2"]):
        changed = list(base)
        changed[i] = other
        keys.add(_torch_binding.cache_key(*changed))
    assert len(keys) == 6
    assert _torch_binding.cache_key(*base) == _torch_binding.cache_key(*base)


def test_cache_dir_follows_the_environment(tmp_path):
    assert _torch_binding.cache_dir({"VTALLOC_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert _torch_binding.cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "vtalloc"
    assert _torch_binding.cache_dir({}) == Path(os.path.expanduser("~")) / ".cache" / "vtalloc"


def test_a_cached_build_is_reused(build_env, tmp_path, capsys):
    path, first = _torch_binding.build(fake_torch(), build_env)
    assert isinstance(first, float) and path.exists()
    assert "building the torch-native binding for torch 2.13.0+cu130" in capsys.readouterr().err
    again, second = _torch_binding.build(fake_torch(), build_env)
    assert (again, second) == (path, "cached")
    assert (tmp_path / "calls.txt").read_text().count("x") == 1
    other, _ = _torch_binding.build(fake_torch("2.11.0+cu130"), build_env)  # another torch: another build
    assert other != path and (tmp_path / "calls.txt").read_text().count("x") == 2
    assert not list((tmp_path / "cache").glob("*.tmp.so"))


# -- the choice ----------------------------------------------------------------------------------

def test_binding_choice_is_normalized_once():
    assert _torch_install.binding_choice(None, {}) == "auto"
    assert _torch_install.binding_choice(None, {"VTALLOC_TORCH_BINDING": " Native "}) == "native"
    assert _torch_install.binding_choice("pluggable", {"VTALLOC_TORCH_BINDING": "native"}) == "pluggable"
    with pytest.raises(InvalidArgumentError, match="VTALLOC_TORCH_BINDING must be one of auto, native, pluggable"):
        _torch_install.binding_choice(None, {"VTALLOC_TORCH_BINDING": "fast"})
    with pytest.raises(InvalidArgumentError, match="binding must be one of"):
        _torch_install.binding_choice("cuda", {})


def _failing_build(torch_module):
    raise _torch_binding.BindingBuildError("no-compiler", "CXX='/nonexistent' is not an executable")


def test_auto_falls_back_with_one_warning_and_the_reason(fresh_warning, caplog):
    with pytest.warns(_torch_install.BindingFallbackWarning, match="no-compiler: CXX='/nonexistent'") as record:
        chosen, lib = _torch_install.prepare(fake_torch(), "auto", build=_failing_build)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again, _ = _torch_install.prepare(fake_torch(), "auto", build=_failing_build)  # no second warning
    assert len([w for w in record if w.category is _torch_install.BindingFallbackWarning]) == 1
    assert lib is None and chosen.kind == again.kind == "pluggable"
    assert chosen.reason.startswith("no-compiler")
    assert "binding='pluggable'" in str(record[0].message)
    assert "pluggable allocator" in caplog.text  # logged each time, warned once


def test_native_raises_with_the_reason(fresh_warning):
    with pytest.raises(BackendUnavailableError, match=r"unavailable \(no-compiler\)"):
        _torch_install.prepare(fake_torch(), "native", build=_failing_build)


def test_pluggable_never_builds():
    def no_build(torch_module):
        raise AssertionError("pluggable must not build")

    chosen, lib = _torch_install.prepare(fake_torch(), "pluggable", build=no_build)
    assert (chosen.kind, chosen.reason, lib) == ("pluggable", None, None)
    assert chosen.library == _native.library_path()


def test_auto_uses_a_native_build_that_loads(monkeypatch):
    loaded = object()
    monkeypatch.setattr(_torch_binding, "load", lambda path: loaded)
    chosen, lib = _torch_install.prepare(fake_torch(), "auto", build=lambda t: (Path("/cache/b.so"), "cached"))
    assert lib is loaded
    assert (chosen.kind, chosen.library, chosen.build, chosen.reason) == ("native", "/cache/b.so", "cached", None)
    assert chosen.describe().startswith("native (torch 2.13.0+cu130, cached build)")


# -- enable() and binding() ----------------------------------------------------------------------

@pytest.fixture
def enable_without_gpu(monkeypatch, fresh_warning, tmp_path):
    """enable() with the CUDA checks and torch's allocator switch faked, as on a CPU-only torch
    (torch.version.cuda None, so the native binding is "unsupported-torch" whichever torch build
    runs the tests: CI's is a CUDA build); state restored after."""
    saved = (state.mode, state.config, state.allocator, state.binding, state.original_record_stream)
    original = torch.Tensor.record_stream
    monkeypatch.setattr(enabling, "_require_cuda", lambda t: None)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setenv("VTALLOC_CACHE_DIR", str(tmp_path / "binding-cache"))
    installed = []
    monkeypatch.setattr(_torch_install, "install", lambda t, b, lib, plug: installed.append(b) or None)
    monkeypatch.delenv("VTALLOC_TORCH_BINDING", raising=False)
    yield installed
    torch.Tensor.record_stream = original
    state.mode, state.config, state.allocator, state.binding, state.original_record_stream = saved
    _torch_shim.release()


@pytest.mark.skipif(torch.version.cuda is None, reason="a CPU-only torch has no libc10_cuda to build against")
def test_the_native_binding_builds_and_loads_against_the_installed_cuda_torch(tmp_path):
    """On a CUDA build of torch (CI installs the newest from PyPI) the binding is compiled and
    linked as enable() does, then loaded into this process beside torch's own libraries: every
    symbol it imports resolves, and its ABI matches the core's. Installing it needs a GPU."""
    env = {**os.environ, "VTALLOC_CACHE_DIR": str(tmp_path)}
    if not _torch_binding.cuda_include_dirs(env, torch.version.cuda):
        pytest.skip("no CUDA headers found")
    path, seconds = _torch_binding.build(torch, env)
    assert seconds != "cached" and path.exists()
    lib = _torch_binding.load(path)
    assert lib.vta_torch_binding_torch_version() == 100 * int(torch.__version__.split(".")[0]) + int(
        torch.__version__.split(".")[1])
    assert _torch_binding.number_formatting_symbols(path) == ()


def test_binding_before_enable_is_none():
    if state.binding is not None:
        pytest.skip("enable() already ran in this process")
    assert vt.binding() == _torch_install.Binding(None)
    assert vt.binding().describe() == "not enabled"


def test_enable_auto_on_a_cpu_torch_falls_back_and_reports_it(enable_without_gpu):
    with pytest.warns(vt.BindingFallbackWarning, match="unsupported-torch"):
        vt.enable()
    b = vt.binding()
    assert b.kind == "pluggable" and b.reason.startswith("unsupported-torch") and b.torch_version == torch.__version__
    assert enable_without_gpu == [b]
    assert torch.Tensor.record_stream is not state.original_record_stream  # the pluggable path's guard
    assert vt.enable() == state.config  # again, same options: nothing happens
    with pytest.raises(vt.AllocatorConflictError, match="binding=native"):
        vt.enable(binding="native")


def test_enable_crosses_into_the_shim_once_to_configure(enable_without_gpu, monkeypatch):
    """enable() hands its options to the shim in one call, which normalizes, applies and returns
    them; enabling again with the same options only asks what they would be, changing nothing."""
    calls = count_shim_calls(monkeypatch)
    cfg = vt.enable(binding="pluggable", capacity="64MiB")
    assert calls == ["vta_torch_configure"]
    assert (cfg.backend, cfg.device, cfg.capacity) == ("cuda", 0, 64 << 20) and cfg == state.config
    calls.clear()
    assert vt.enable(capacity="64MiB") == cfg
    assert calls == ["vta_torch_normalize_config"]
    calls.clear()
    with pytest.raises(vt.AllocatorConflictError, match="cannot switch"):
        vt.enable(capacity="128MiB")
    assert calls == ["vta_torch_normalize_config"] and _torch_shim.current_config()[2]["capacity_bytes"] == 64 << 20


def test_enable_native_raises_and_changes_nothing(enable_without_gpu):
    with pytest.raises(BackendUnavailableError, match="unsupported-torch"):
        vt.enable(binding="native")
    assert state.mode is None and vt.binding().kind is None and enable_without_gpu == []


def test_enable_pluggable_refuses_cudnn_benchmark_but_native_does_not(enable_without_gpu, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    with pytest.raises(vt.AllocatorConflictError, match="cudnn.benchmark"):
        vt.enable(binding="pluggable")
    monkeypatch.setattr(_torch_install, "prepare",
                        lambda t, choice: (_torch_install.Binding("native", library="/x.so", build=1.0), object()))
    vt.enable()
    assert vt.binding().kind == "native"
    assert state.original_record_stream is None  # no record_stream guard under the native binding


def test_enable_rejects_a_bad_binding():
    with pytest.raises(InvalidArgumentError, match="binding must be one of"):
        vt.enable(binding="fastest")


def test_cuda_headers_of_torchs_cuda_major_come_first(tmp_path, monkeypatch):
    """With two toolkits, the headers of torch's CUDA major version are the ones compiled against."""
    for name, version in (("cuda12", 12080), ("cuda13", 13000)):
        inc = tmp_path / name / "include"
        inc.mkdir(parents=True)
        (inc / "cuda_runtime_api.h").write_text(f"#pragma once\n#define CUDART_VERSION {version}\n")
    env = {"CUDA_HOME": str(tmp_path / "cuda12"), "CUDA_PATH": str(tmp_path / "cuda13"), "PATH": os.environ["PATH"]}
    monkeypatch.setattr(_torch_binding.sys, "path", [])
    dirs = _torch_binding.cuda_include_dirs(env, "13.0")
    assert dirs[0] == str(tmp_path / "cuda13" / "include")
    assert _torch_binding.cuda_include_dirs(env, "12.8")[0] == str(tmp_path / "cuda12" / "include")


# -- the allocator interface (scripts/check_torch_binding_abi.py, run per torch wheel by hand) ---------

def _abi_check():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "check_torch_binding_abi.py"
    spec = importlib.util.spec_from_file_location("check_torch_binding_abi", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_binding_overrides_every_virtual_of_the_installed_torchs_allocator_but_the_listed_ones():
    """What the ABI check does for each wheel, here against the installed torch's headers: no pure
    virtual is left and nothing is inherited from torch's CUDAAllocator that is not listed on purpose."""
    if not _torch_binding.cuda_include_dirs():
        pytest.skip("no CUDA headers found")
    check = _abi_check()
    slots = check.vtable_slots(torch, _torch_binding.cuda_include_dirs())
    assert any("VtaAllocator::recordHistory" in s for s in slots) and any("VtaAllocator::snapshot" in s for s in slots)
    assert not [s for s in slots if "__cxa_pure_virtual" in s]
    assert set(check.inherited(slots)) <= check.INHERITED_ON_PURPOSE


def test_the_vtable_check_reports_a_virtual_a_newer_torch_would_add():
    check = _abi_check()
    slots = ["(int (*)(...))0", "(int (*)(...))(& _ZTIN9vta_torch12VtaAllocatorE)",
             "(int (*)(...))vta_torch::VtaAllocator::allocate",
             "(int (*)(...))c10::cuda::CUDACachingAllocator::CUDAAllocator::markCaptureBegin",
             "(int (*)(...))c10::cuda::CUDACachingAllocator::CUDAAllocator::someNewHook"]
    inherited = check.inherited(slots)
    assert inherited == ["c10::cuda::CUDACachingAllocator::CUDAAllocator::markCaptureBegin",
                         "c10::cuda::CUDACachingAllocator::CUDAAllocator::someNewHook"]
    assert [s for s in inherited if s not in check.INHERITED_ON_PURPOSE] == [inherited[1]]


@pytest.mark.parametrize("version", ["2.11.0_cu130", "2.12.0_cu130", "2.13.0_cu130", "2.14.1_cu130", "2.15.0_cu132"])
def test_each_supported_torch_wheel_was_checked_and_passed(version):
    """The committed results of the ABI check (docs/torch.md lists the command), one per torch the
    binding supports: built, linked, every import exported, the vtable as meant."""
    import json

    result = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" /
                         f"torch_binding_abi-{version}.json").read_text())
    assert result["ok"] is True and result["checks"]["compiled_and_linked"]
    assert result["checks"]["imports_unresolved"] == [] and result["checks"]["number_formatting"] == []
    assert result["checks"]["inherited_unexpected"] == [] and result["checks"]["pure_virtual_left"] == []
    lo, hi = _torch_binding.SUPPORTED_TORCH
    assert lo <= tuple(int(x) for x in version.split("_")[0].split(".")[:2]) <= hi
