"""Check the torch-native binding against one torch wheel's headers and libraries, on a CPU.

Owns: the ABI check docs/torch.md ("Which torch versions") describes, run for one torch:
  1. compile and link csrc/torch_binding/ as allocator/torch/binding_build.build() does (same
     flags, the C++ standard that torch's headers need) against the wheel's headers and its
     libc10 / libc10_cuda / libtorch_cuda, with CUDA's headers and the core library;
  2. the built library formats no number through a C++ stream (binding_build's own check);
  3. every symbol it imports is exported by torch's libraries, the CUDA runtime, the core
     library or the system's C/C++ runtime (nothing left for the loader to miss at enable());
  4. the allocator interface's virtuals match: the vtable of VtaAllocator (g++ -fdump-lang-class)
     has no pure virtual left and no slot inherited from torch's CUDAAllocator beyond
     INHERITED_ON_PURPOSE, so a virtual a newer torch adds shows up here, not on a user's GPU.
Writes benchmarks/results/torch_binding_abi-<torch version>.json (machine, date, commit, command,
each check's result) and exits 1 if any check fails.
Invariants: reads the wheel, writes only a temporary directory and the JSON; the wheel is never
copied into the repository.

Usage: python scripts/check_torch_binding_abi.py TORCH_WHEEL_OR_EXTRACTED_DIR [--cudart PATH] [--out DIR]
(a .whl is unpacked, headers and the five libraries only, into a temporary directory).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from lib.provenance import git_info, machine_info  # noqa: E402

from vtalloc.allocator import _native, elf_symbols  # noqa: E402
from vtalloc.allocator.torch import binding_build  # noqa: E402

TORCH_LIBS = ("libc10.so", "libc10_cuda.so", "libtorch_cuda.so", "libtorch_cpu.so", "libtorch.so")
SYSTEM_LIBS = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2")
# Virtuals of torch's CUDAAllocator (and its bases) the binding keeps on purpose: their defaults
# are right for vtalloc (docs/torch.md, "The torch-native binding").
INHERITED_ON_PURPOSE = {
    "c10::Allocator::is_simple_data_ptr",  # the default test (data == context) holds for the binding's DataPtrs
    # the c10::Stream overload only converts to a CUDAStream and calls the binding's recordStream
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::recordStream",
    # no-ops: vtalloc's capture handling needs no notice (graph pools come through beginAllocateToPool)
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::markCaptureBegin",
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::markCaptureEnd",
    # returns no per-pointer context: the snapshot's blocks carry theirs (vta_history.hpp)
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::getContextForPointer",
    # record_function annotations and torch.compile contexts: accepted, not kept
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::recordAnnotation",
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::pushCompileContext",
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::popCompileContext",
    # raises torch's "does not yet support allocateWithAddress" (vtalloc places no block at a given address)
    "c10::cuda::CUDACachingAllocator::CUDAAllocator::allocateWithAddress",
}


def extract(wheel: Path, into: Path) -> Path:
    """The wheel's headers and TORCH_LIBS, unpacked into ``into``; returns the torch folder."""
    with zipfile.ZipFile(wheel) as z:
        wanted = [n for n in z.namelist() if n.startswith("torch/include/") or n == "torch/version.py"
                  or n in {f"torch/lib/{lib}" for lib in TORCH_LIBS}]
        z.extractall(into, wanted)
    return into / "torch"


def torch_like(torch_dir: Path) -> Any:
    """What binding_build reads of a torch module, from an unpacked wheel's version.py."""
    text = (torch_dir / "version.py").read_text()
    version = re.search(r"__version__ = '([^']+)'", text).group(1)
    cuda = re.search(r"cuda: Optional\[str\] = '([^']+)'", text)
    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda and cuda.group(1)),
                                 __file__=str(torch_dir / "__init__.py"),
                                 _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True))


def build(torch: Any, out: Path) -> tuple[list[str], subprocess.CompletedProcess]:
    """Compile and link as binding_build.build() does."""
    cuda = binding_build.cuda_include_dirs(None, torch.version.cuda)
    core = _native.library_path()
    lib = str(Path(torch.__file__).parent / "lib")
    sources = [str(f) for f in binding_build.source_files() if f.suffix == ".cpp"]
    cmd = [binding_build.find_compiler(), "-O2", "-shared", *binding_build._compile_args(torch, cuda), *sources,
           "-o", str(out), f"-L{lib}", "-lc10", "-lc10_cuda", "-ltorch_cuda", f"-Wl,-rpath,{lib}",
           f"-L{Path(core).parent}", f"-l:{Path(core).name}", "-Wl,--no-undefined-version"]
    return cmd, subprocess.run(cmd, capture_output=True, text=True)


def exported(path: str) -> set[str]:
    return {s.name.split("@", 1)[0] for s in elf_symbols.symbols(path) if s.defined}


def system_lib(name: str) -> str | None:
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    m = re.search(rf"\s{re.escape(name)} \(libc6,x86-64[^)]*\) => (\S+)", out)
    return m.group(1) if m else None


def unresolved_imports(library: Path, providers: list[str]) -> tuple[list[str], dict[str, int]]:
    """The library's imported symbols that no provider exports (weak C++ runtime hooks aside)."""
    available: set[str] = set()
    counts = {}
    for p in providers:
        names = exported(p)
        counts[Path(p).name] = len(names)
        available |= names
    imported = {s.split("@", 1)[0] for s in elf_symbols.undefined_dynamic_symbols(str(library))}
    optional = {"__gmon_start__", "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable"}
    return sorted(imported - available - optional), counts


def vtable_slots(torch: Any, cuda: list[str]) -> list[str]:
    """VtaAllocator's vtable, slot by slot, as g++ -fdump-lang-class writes it."""
    with tempfile.TemporaryDirectory(prefix="vtalloc-vtable-") as tmp:
        src = next(f for f in binding_build.source_files() if f.name == "vta_allocator.cpp")
        # A CPU-only torch wheel ships c10/cuda's headers without the generated one they include.
        shim = Path(tmp) / "shim" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        shim.parent.mkdir(parents=True)
        shim.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        args = binding_build._compile_args(torch, cuda, extra_includes=[str(Path(tmp) / "shim")])
        cmd = [binding_build.find_compiler(), "-fsyntax-only", "-fdump-lang-class", *args, str(src),
               "-dumpdir", f"{tmp}/"]
        subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tmp)
        dump = next(Path(tmp).glob("*.class")).read_text()
    start = dump.index("Vtable for vta_torch::VtaAllocator")
    block = dump[start:dump.index("\n\n", start)]
    return [ln.split(None, 1)[1].strip() for ln in block.splitlines()[1:] if re.match(r"^\d+\s", ln)]


def inherited(slots: list[str]) -> list[str]:
    """The slots whose function is a base class's, not VtaAllocator's (offset and typeinfo aside)."""
    out = []
    for slot in slots:
        m = re.fullmatch(r"\(int \(\*\)\(\.\.\.\)\)([A-Za-z_][\w:~]*)", slot)
        if m and not m.group(1).startswith("vta_torch::"):
            out.append(m.group(1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("torch", type=Path, help="a torch wheel (.whl) or a folder holding its torch/ (unpacked)")
    ap.add_argument("--cudart", default="/usr/local/cuda/lib64/libcudart.so.13",
                    help="the CUDA runtime library the binding's cuda* calls bind to (torch's libc10_cuda loads it)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vtalloc-abi-") as tmp:
        torch_dir = extract(args.torch, Path(tmp)) if args.torch.suffix == ".whl" else args.torch / "torch"
        torch = torch_like(torch_dir)
        cuda = binding_build.cuda_include_dirs(None, torch.version.cuda)
        library = Path(tmp) / "binding.so"
        cmd, proc = build(torch, library)
        checks: dict[str, Any] = {"compiled_and_linked": proc.returncode == 0}
        if proc.returncode != 0:
            checks["compiler_output"] = proc.stderr[-4000:]
        else:
            checks["number_formatting"] = list(binding_build.number_formatting_symbols(library))
            providers = [str(torch_dir / "lib" / lib) for lib in TORCH_LIBS if (torch_dir / "lib" / lib).exists()]
            providers += [args.cudart, _native.library_path()]
            providers += [p for p in map(system_lib, SYSTEM_LIBS) if p]
            missing, counts = unresolved_imports(library, providers)
            checks["imports_unresolved"] = missing
            checks["providers"] = counts
            checks["imports"] = len(elf_symbols.undefined_dynamic_symbols(str(library)))
            slots = vtable_slots(torch, cuda)
            checks["vtable_slots"] = len(slots)
            checks["pure_virtual_left"] = [s for s in slots if "__cxa_pure_virtual" in s]
            inh = inherited(slots)
            checks["inherited"] = inh
            checks["inherited_unexpected"] = [s for s in inh if s not in INHERITED_ON_PURPOSE]
        ok = (checks["compiled_and_linked"] and not checks.get("number_formatting")
              and not checks.get("imports_unresolved") and not checks.get("pure_virtual_left")
              and not checks.get("inherited_unexpected"))
    result = {
        "what": "the torch-native binding built and its ABI checked against one torch wheel, on a CPU",
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cxx_standard": binding_build.cxx_standard(torch),
        "ok": bool(ok), "checks": checks,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "git": git_info(),
        "command": "python scripts/check_torch_binding_abi.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "compile_command": [c if not c.startswith(tmp) else c.replace(tmp, "$TMP") for c in cmd],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.-]", "_", torch.__version__)
    path = args.out / f"torch_binding_abi-{safe}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"torch {torch.__version__}: {'ok' if ok else 'FAILED'} -> {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    for key in ("number_formatting", "imports_unresolved", "pure_virtual_left", "inherited_unexpected"):
        if checks.get(key):
            print(f"  {key}: {checks[key][:12]}")
    if not checks["compiled_and_linked"]:
        print(checks["compiler_output"])
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
