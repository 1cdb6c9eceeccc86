"""Build and load the torch-native binding (csrc/torch_binding/) against the torch in this process.

Owns: finding what the build needs (a C++ compiler, torch's headers and libraries, CUDA's
headers, the core library), the per-user build cache (``VTALLOC_CACHE_DIR``, else
``$XDG_CACHE_HOME/vtalloc``, else ``~/.cache/vtalloc``), and loading the built library with
ctypes and installing it as torch's allocator. Never imports torch at module import: the
functions that need it take the torch module as an argument.
Invariants: every failure is a :class:`BindingBuildError` whose ``failure.kind`` says which step
failed (:data:`FAILURE_KINDS`) and whose message says how to fix it; a cached build is keyed by
everything it depends on (torch version, CUDA version, C++ ABI, the binding's sources, the core
library) and is written atomically (a temp name, then a rename) under a lock file, so two
processes never race and a half-written library is never loaded.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import _native, elf_symbols
from ..errors import BackendUnavailableError

__all__ = [
    "BuildFailure", "BindingBuildError", "FAILURE_KINDS", "SUPPORTED_TORCH", "CompileCheck", "build", "cache_dir",
    "cache_key", "find_compiler", "cuda_include_dirs", "source_files", "compile_check", "number_formatting_symbols",
    "load", "install", "cxx_standard", "CXX20_FROM",
]

log = logging.getLogger("vtalloc.allocator")

FAILURE_KINDS = ("no-compiler", "no-cuda-headers", "unsupported-torch", "compile-error", "stream-formatting",
                 "load-error", "abi-mismatch")
# (major, minor) range of torch whose allocator interface the binding implements
# (TORCH_BINDING_MIN / MAX in csrc/torch_binding/vta_allocator.hpp).
SUPPORTED_TORCH = ((2, 11), (2, 15))
# torch 2.14's headers need C++20 (std::strong_ordering, std::bit_width); before it, C++17 as built and checked.
CXX20_FROM = (2, 14)
ESTIMATED_BUILD_S = 40
_TAIL_CHARS = 2000


@dataclasses.dataclass(frozen=True)
class BuildFailure:
    kind: str     # one of FAILURE_KINDS
    detail: str   # what happened and how to fix it

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


class BindingBuildError(BackendUnavailableError):
    """The torch-native binding cannot be built or loaded here; ``failure`` says why."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"vtalloc's torch-native binding is unavailable ({kind}): {detail}")
        self.failure = BuildFailure(kind, detail)


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


# -- what the build needs --------------------------------------------------------------------

def _source_root() -> Path:
    """Where the binding's sources are: copied into the package by setup.py (a wheel), else the repo."""
    package = Path(__file__).resolve().parent.parent  # vtalloc/allocator (this file is in its torch/)
    packaged = package / "_binding_src"
    return packaged if (packaged / "torch_binding").is_dir() else package.parent / "csrc"


def source_files() -> list[Path]:
    """The binding's sources and the vtalloc headers it includes, in a stable order."""
    root = _source_root()
    files = sorted((root / "torch_binding").glob("*.[ch]pp")) + sorted((root / "include" / "vtalloc").glob("*.h"))
    if not any(f.suffix == ".cpp" for f in files):
        raise BindingBuildError("compile-error", f"the binding's sources are missing from {root}: reinstall vtalloc")
    return files


def find_compiler(environ: Mapping[str, str] | None = None) -> str:
    """$CXX, else c++, else g++ (on PATH)."""
    env = _environ(environ)
    wanted = env.get("CXX")
    candidates = [wanted] if wanted else ["c++", "g++"]
    for name in candidates:
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    raise BindingBuildError(
        "no-compiler",
        (f"CXX={wanted!r} is not an executable" if wanted else "no C++ compiler (c++ or g++) on PATH")
        + ": install one (e.g. apt install g++) or set CXX")


def _cudart_major(include_dir: str) -> int | None:
    """The CUDA major version of the headers in ``include_dir`` (CUDART_VERSION), None if unreadable."""
    try:
        with open(os.path.join(include_dir, "cuda_runtime_api.h"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("#define CUDART_VERSION"):
                    return int(line.split()[2]) // 1000
    except (OSError, ValueError, IndexError):
        pass
    return None


def cuda_include_dirs(environ: Mapping[str, str] | None = None, cuda_version: str | None = None) -> list[str]:
    """Directories holding cuda_runtime_api.h: $CUDA_HOME / $CUDA_PATH, /usr/local/cuda, then the
    pip nvidia-* packages (site-packages/nvidia/*/include, nvidia/cu*/include). With
    ``cuda_version`` (torch.version.cuda), headers of that CUDA major version come first."""
    env = _environ(environ)
    roots = [env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"]
    dirs = [os.path.join(r, "include") for r in roots if r]
    for site in sys.path:
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    found = list(dict.fromkeys(d for d in dirs if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))))
    if cuda_version:
        major = int(cuda_version.split(".")[0])
        found.sort(key=lambda d: _cudart_major(d) != major)  # stable: matching headers first
    return found


# The binding does not link a CUDA runtime: its cuda* calls bind to the libcudart that torch's
# libc10_cuda already loaded (a dependency of the binding's own libc10_cuda). Linking one found
# on disk could load a second runtime of another major version into the process.


def torch_version_tuple(torch: Any) -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_torch(torch: Any) -> None:
    """Refuse a torch outside :data:`SUPPORTED_TORCH` or built without CUDA. A newer torch than
    the binding was checked against is refused too (its allocator interface may have changed:
    scripts/check_torch_binding_abi.py checks a new one), so "auto" falls back to the pluggable binding."""
    version = torch_version_tuple(torch)
    lo, hi = SUPPORTED_TORCH
    checked = f"{lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}"
    if version > hi:
        raise BindingBuildError(
            "unsupported-torch",
            f"torch {torch.__version__} is newer than the versions this vtalloc's torch-native binding was built and "
            f"checked against ({checked}); its allocator interface may differ, so PyTorch's pluggable interface is "
            "used instead. A vtalloc release that lists this torch brings the native binding back")
    if version < lo:
        raise BindingBuildError(
            "unsupported-torch",
            f"torch {torch.__version__} is older than the versions the binding supports ({checked}); use one of "
            "those, or binding='pluggable'")
    if torch.version.cuda is None:
        raise BindingBuildError("unsupported-torch", f"torch {torch.__version__} is a CPU-only build")


def _torch_dirs(torch: Any) -> tuple[list[str], str]:
    root = Path(torch.__file__).resolve().parent
    include = [str(root / "include"), str(root / "include" / "torch" / "csrc" / "api" / "include")]
    return [d for d in include if os.path.isdir(d)], str(root / "lib")


def _cxx11_abi(torch: Any) -> int:
    return int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))


def _digest(paths: Sequence[Path | str]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).name.encode() + b"\0" + Path(p).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = _environ(environ)
    if env.get("VTALLOC_CACHE_DIR"):
        return Path(env["VTALLOC_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vtalloc"


def cache_key(torch_version: str, cuda_version: str | None, cxx11_abi: int, sources_digest: str,
              core_digest: str) -> str:
    """The cached library's name: everything the built binding depends on."""
    h = hashlib.sha256("\0".join([torch_version, str(cuda_version), str(cxx11_abi), sources_digest,
                                  core_digest]).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in ".-" else "_" for c in torch_version)
    return f"torch_binding-{safe}-{h}"


# -- the compiler ----------------------------------------------------------------------------

def cxx_standard(torch: Any) -> str:
    """The -std flag torch's headers need: c++20 from torch 2.14, c++17 before."""
    return "-std=c++20" if torch_version_tuple(torch) >= CXX20_FROM else "-std=c++17"


def _compile_args(torch: Any, cuda_includes: list[str], *, extra_includes: Sequence[str] = ()) -> list[str]:
    includes, _ = _torch_dirs(torch)
    # -DNDEBUG as torch's own extension builds: torch's debug-only asserts (c10::Device::validate)
    # format numbers through c10::str, which the binding must never link (raise.hpp).
    args = [cxx_standard(torch), "-fPIC", "-fvisibility=hidden", "-DNDEBUG", f"-D_GLIBCXX_USE_CXX11_ABI={_cxx11_abi(torch)}",
            f"-I{_source_root()}", f"-I{_source_root() / 'include'}"]
    for d in [*includes, *extra_includes, *cuda_includes]:
        args.append(f"-isystem{d}")
    return args


def _tail(text: str) -> str:
    return text[-_TAIL_CHARS:].strip()


@dataclasses.dataclass(frozen=True)
class CompileCheck:
    ok: bool                          # compiled, and formats no number through a stream
    returncode: int
    output: str
    command: tuple[str, ...]
    number_formatting: tuple[str, ...]  # the offending symbols (elf_symbols.formats_numbers)


def number_formatting_symbols(library: Path | str) -> tuple[str, ...]:
    """The symbols of a built binding that write a number into a C++ stream, imported or
    defined: none is allowed (docs/design.md, "No iostreams in the core or the binding")."""
    return tuple(sorted({s.name for s in elf_symbols.symbols(str(library)) if elf_symbols.formats_numbers(s.name)}))


def compile_check(torch: Any, environ: Mapping[str, str] | None = None) -> CompileCheck:
    """Compile the binding as :func:`build` does (same flags, -O2) against ``torch``'s headers and
    the CUDA headers into a shared library that is linked to nothing (no torch or CUDA libraries
    needed, so a CPU-only torch will do), and read its symbols. Raises BindingBuildError only for
    a missing compiler or CUDA headers; a compile error or a number formatted through a stream is
    ``ok=False``."""
    env = _environ(environ)
    cxx = find_compiler(env)
    cuda = cuda_include_dirs(env)
    if not cuda:
        raise BindingBuildError("no-cuda-headers", _NO_CUDA_HEADERS)
    includes, _ = _torch_dirs(torch)
    with tempfile.TemporaryDirectory(prefix="vtalloc-compile-check-") as tmp:
        extra = []
        # A CPU-only torch wheel ships c10/cuda's headers without the generated one they include.
        if not any(os.path.exists(os.path.join(d, "c10/cuda/impl/cuda_cmake_macros.h")) for d in includes):
            shim = Path(tmp) / "c10" / "cuda" / "impl"
            shim.mkdir(parents=True)
            (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
            extra.append(tmp)
        out = Path(tmp) / "binding_check.so"
        cmd = [cxx, "-O2", "-shared", "-Wall", *_compile_args(torch, cuda, extra_includes=extra),
               *[str(f) for f in source_files() if f.suffix == ".cpp"], "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        offending = number_formatting_symbols(out) if proc.returncode == 0 and out.exists() else ()
    ok = proc.returncode == 0 and not offending
    return CompileCheck(ok, proc.returncode, proc.stdout + proc.stderr, tuple(cmd), offending)


_NO_CUDA_HEADERS = ("no CUDA headers (cuda_runtime_api.h) found in $CUDA_HOME, $CUDA_PATH, /usr/local/cuda or the "
                    "pip nvidia-* packages: install the CUDA toolkit's headers (or pip install nvidia-cuda-runtime-cu12 "
                    "/ the cu13 one) or set CUDA_HOME")


def build(torch: Any, environ: Mapping[str, str] | None = None) -> tuple[Path, float | str]:
    """The binding's library for ``torch``, built once into the cache: (path, build seconds or "cached")."""
    env = _environ(environ)
    check_torch(torch)
    cxx = find_compiler(env)
    cuda = cuda_include_dirs(env, torch.version.cuda)
    if not cuda:
        raise BindingBuildError("no-cuda-headers", _NO_CUDA_HEADERS)
    core = _native.library_path()
    key = cache_key(torch.__version__, torch.version.cuda, _cxx11_abi(torch), _digest(source_files()),
                    _digest([core]))
    directory = cache_dir(env)
    target = directory / f"{key}.so"
    if target.exists():
        return target, "cached"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / f"{key}.lock", "w")
    except OSError as e:
        raise BindingBuildError("compile-error", f"cannot write the build cache {directory}: {e}; set "
                                                 "VTALLOC_CACHE_DIR to a writable directory") from None
    import fcntl

    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process building the same key: wait for it
        if target.exists():
            return target, "cached"
        message = (f"vtalloc: building the torch-native binding for torch {torch.__version__} "
                   f"(once, ~{ESTIMATED_BUILD_S} s)…")
        log.info(message)
        print(message, file=sys.stderr, flush=True)
        _, torch_lib = _torch_dirs(torch)
        core_dir = os.path.dirname(os.path.abspath(core))
        tmp = directory / f".{key}.{os.getpid()}.tmp.so"
        cmd = [cxx, "-O2", "-shared", *_compile_args(torch, cuda),
               *[str(f) for f in source_files() if f.suffix == ".cpp"], "-o", str(tmp),
               f"-L{torch_lib}", "-lc10", "-lc10_cuda", "-ltorch_cuda", f"-Wl,-rpath,{torch_lib}",
               f"-L{core_dir}", f"-l:{os.path.basename(core)}", f"-Wl,-rpath,{core_dir}"]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise BindingBuildError("no-compiler", f"running {cxx} failed: {e}") from None
        seconds = time.monotonic() - start
        if proc.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            raise BindingBuildError(
                "compile-error",
                f"{cxx} exited {proc.returncode} building against torch {torch.__version__}; its output ends:\n"
                f"{_tail(proc.stdout + proc.stderr)}")
        os.replace(tmp, target)
    log.info("vtalloc: built the torch-native binding in %.1f s: %s", seconds, target)
    return target, round(seconds, 1)


# -- loading ---------------------------------------------------------------------------------

_loaded: dict[str, ctypes.CDLL] = {}


def _core_abi() -> int | None:
    fn = getattr(_native.load(), "vta_torch_native_abi", None)
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_int32, []
    return int(fn())


def share_cxx_runtime() -> str | None:
    """Put the C++ runtime torch already loaded (libstdc++) in the process's global symbol scope,
    before the binding is loaded: a compiler that instantiates libstdc++'s stream templates in
    the binding (Ubuntu's g++ 13.3 on the GPU image of 2026-11-28) gives it weak copies of their
    static state (a facet's locale::id among them), and a library loaded with RTLD_LOCAL resolves
    its own references to its own copies first; with libstdc++ global they resolve to the one
    runtime, as in any C++ program linked against it. Loads nothing new (RTLD_NOLOAD); the soname
    made global, or None where none is loaded."""
    for name in ("libstdc++.so.6",):
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
            return name
        except OSError:
            continue
    return None


def load(path: Path | str) -> ctypes.CDLL:
    """Load the built binding and check it against the core library (loaded first: the binding
    uses the very same one). Changes nothing of torch's."""
    core_abi = _core_abi()
    if core_abi is None:
        raise BindingBuildError("abi-mismatch", f"the core library {_native.library_path()} has no torch-native ABI "
                                                "(vta_torch_native_abi): reinstall vtalloc")
    if str(path) not in _loaded and share_cxx_runtime() is None:
        # The binding's own code formats nothing through streams (csrc/torch_binding/raise.hpp);
        # a toolchain may still put stream code in it (docs/design.md): without the one shared
        # runtime, such a library is never loaded.
        try:
            offending = number_formatting_symbols(path)
        except (OSError, ValueError):
            offending = ()  # not a library: the load below says so
        if offending:
            raise BindingBuildError(
                "stream-formatting",
                f"{path} writes numbers into C++ streams ({', '.join(offending[:4])}) and the process's C++ runtime "
                "(libstdc++.so.6) could not be made global before loading it, which crashed processes at their "
                "first out-of-memory on GPU machines (docs/design.md, \"No iostreams in the core or the binding\")")
    try:
        lib = _loaded.get(str(path)) or ctypes.CDLL(str(path))
    except OSError as e:
        raise BindingBuildError("load-error", f"loading {path} failed: {e}; delete it to rebuild") from None
    try:
        lib.vta_torch_binding_abi.restype = ctypes.c_int32
        lib.vta_torch_binding_install.restype = ctypes.c_int
        lib.vta_torch_binding_last_error.restype = ctypes.c_char_p
    except AttributeError as e:
        raise BindingBuildError("load-error", f"{path} is not vtalloc's torch binding: {e}") from None
    if lib.vta_torch_binding_abi() != core_abi:
        raise BindingBuildError("abi-mismatch", f"{path} was built for torch-native ABI {lib.vta_torch_binding_abi()}"
                                                f", this vtalloc's core has {core_abi}: delete it to rebuild")
    _loaded[str(path)] = lib
    return lib


def install(lib: ctypes.CDLL) -> None:
    """Make the loaded binding torch's allocator (refused once torch's allocator is initialized)."""
    status = lib.vta_torch_binding_install()
    if status != 0:
        message = (lib.vta_torch_binding_last_error() or b"").decode(errors="replace")
        kind = "abi-mismatch" if message.startswith("ABI mismatch") else "load-error"
        raise BindingBuildError(kind, message)
