"""vtalloc before `import torch`: the order `vtalloc demo` uses, and every user may.

On a GPU machine (torch 2.11.0+cu130, libstdc++ of GCC 14), any address space created before
`import torch` made the import die with SIGSEGV inside libstdc++'s locale code: the core read
/proc/meminfo with a std::ifstream, so the process's C++ locale was first set up from the core.
The core now uses no iostreams or locale facilities at all (docs/design.md, "No iostreams in
the core"). These tests hold that: the built library imports none of those symbols, spaces
of every backend and mode made before torch leave torch working, and the demo runs end to
end in a fresh process exactly as the README runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vtalloc.allocator import _native
from vtalloc.allocator.elf_symbols import is_iostream_or_locale, undefined_dynamic_symbols
from helpers.subproc import run_python

# Imported by the core as built on 2026-11-22, when `import torch` crashed after it.
IFSTREAM_BUILD_IMPORTS = [
    "_ZNSi10_M_extractImEERSiRT_@GLIBCXX_3.4.9",
    "_ZNSi6ignoreEli@GLIBCXX_3.4",
    "_ZNSt12__basic_fileIcED1Ev@GLIBCXX_3.4",
    "_ZNSt13basic_filebufIcSt11char_traitsIcEE4openEPKcSt13_Ios_Openmode@GLIBCXX_3.4",
    "_ZNSt14basic_ifstreamIcSt11char_traitsIcEED1Ev@GLIBCXX_3.4",
    "_ZNSt6localeD1Ev@GLIBCXX_3.4",
    "_ZNSt8ios_baseC2Ev@GLIBCXX_3.4",
    "_ZNSt9basic_iosIcSt11char_traitsIcEE4initEPSt15basic_streambufIcS1_E@GLIBCXX_3.4",
    "_ZStrsIcSt11char_traitsIcESaIcEERSt13basic_istreamIT_T0_ES7_RNSt7__cxx1112basic_stringIS4_S5_T1_EE@GLIBCXX_3.4.21",
    "_ZTVSt15basic_streambufIcSt11char_traitsIcEE@GLIBCXX_3.4",
    "_ZSt4cout@GLIBCXX_3.4",
    "_ZNSo9_M_insertIlEERSoT_@GLIBCXX_3.4.9",
    "_ZSt21ios_base_library_initv@GLIBCXX_3.4.32",
]
ORDINARY_IMPORTS = [
    "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm@GLIBCXX_3.4.21",
    "_ZSt20__throw_length_errorPKc@GLIBCXX_3.4",
    "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE@GLIBCXX_3.4.22",
    "_ZdlPvm@CXXABI_1.3.9",
    "mmap@GLIBC_2.2.5",
    "__cxa_allocate_exception@CXXABI_1.3",
]


def test_the_check_knows_iostream_and_locale_symbols():
    assert [s for s in IFSTREAM_BUILD_IMPORTS if not is_iostream_or_locale(s)] == []
    assert [s for s in ORDINARY_IMPORTS if is_iostream_or_locale(s)] == []


def test_core_imports_no_iostream_or_locale_symbol():
    imports = undefined_dynamic_symbols(_native.library_path())
    assert len(imports) > 50, "the ELF reader found the library's imports"
    offending = sorted(s for s in imports if is_iostream_or_locale(s))
    assert offending == [], f"the core must not use iostreams/locale (docs/design.md): {offending}"


SPACES_THEN_TORCH = """
import json, sys
from vtalloc.allocator import AddressSpace, _native
from vtalloc.allocator.config import Config
assert "torch" not in sys.modules
backend = sys.argv[1]
made = []
modes = ["auto", "mapped", "copy"] if backend == "host" else ["auto"]
for mode in modes:
    # No host_capacity: the default is computed from the machine's memory, the path that crashed.
    s = AddressSpace(backend=backend, capacity="64MiB", evict_mode=mode)
    a = s.malloc(3 << 20)
    s.write(a, b"before torch")
    made.append((s, a))
raw = _native.ctypes.c_void_p()
_native.check(_native.load().vta_space_create(_native.make_config(Config(backend=backend, capacity="64MiB")), _native.ctypes.byref(raw)))
assert "torch" not in sys.modules

import torch  # noqa: E402  (the import that crashed)

x = torch.randn(64, 64, requires_grad=True)
loss = torch.nn.functional.gelu(x @ x.T).sum()
loss.backward()
text = str(torch.ones(3))  # c10 streams a value through an ostream, as torch's import does
for s, a in made:
    assert s.read(a, 12) == b"before torch"
    s.free(a)
    s.close()
_native.check(_native.load().vta_space_close(raw))
_native.load().vta_space_destroy(raw)
print(json.dumps({"torch": torch.__version__, "grad_finite": bool(torch.isfinite(x.grad).all()), "text": text}))
"""


@pytest.mark.parametrize("backend", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_spaces_made_before_import_torch_leave_torch_working(backend):
    out = run_python(SPACES_THEN_TORCH, backend, timeout=300)
    assert out["grad_finite"] and out["text"].startswith("tensor([1., 1., 1.])")


def _vtalloc_command() -> list[str]:
    script = Path(sys.executable).parent / "vtalloc"
    if script.exists():
        return [str(script)]
    found = shutil.which("vtalloc")
    return [found] if found else [sys.executable, "-c", "from vtalloc.client.cli import main; main()"]


def test_vtalloc_demo_runs_end_to_end_in_a_fresh_process():
    """The README's main job, as a user runs it: defragmentation first (spaces before torch),
    then training. Host backend here; cuda where a GPU is usable (backend auto)."""
    proc = subprocess.run(_vtalloc_command() + ["demo"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "120"})
    died = -proc.returncode if proc.returncode < 0 else 0
    assert died != signal.SIGSEGV, f"vtalloc demo died with SIGSEGV\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"vtalloc demo exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "surviving allocations' bytes intact: True" in proc.stdout
    assert "identical to the same training on plain" in proc.stdout and "True" in proc.stdout
