"""Build the C++ core (csrc/) into one shared library inside vtalloc.allocator.

Only a C++17 compiler is needed: no nvcc, no CUDA headers, no libcuda at link time (the
cuda backend resolves the driver at run time). The library is loaded with ctypes, not
imported, so it exports only the C ABI of csrc/include/vtalloc/vtalloc.h.

csrc/torch_binding/ is not part of it: that is the torch-native binding, compiled against the
user's torch at the first enable() (allocator/torch/binding_build.py). Its sources and the vtalloc
headers they include are copied into the package (vtalloc/allocator/_binding_src/) so a wheel
can build it; an editable install reads them from the repo. The JSON Schemas of schemas/ are
copied the same way (vtalloc/client/_schemas/, read by vtalloc.client.schemas).

Wheels are tagged py3-none-<platform> (PlatformWheel); scripts/build_wheels.sh builds and
checks the portable one (docs/packaging.md).
"""

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent
EXCLUDED = {"tests", "torch_binding"}
sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cpp") if not EXCLUDED & set(p.parts))
SCHEMAS = sorted((ROOT / "schemas").glob("*.schema.json"))
BINDING_SOURCES = [*sorted((ROOT / "csrc" / "torch_binding").glob("*.[ch]pp")),
                   *sorted((ROOT / "csrc" / "include" / "vtalloc").glob("*.h"))]


class BuildPyWithBindingSources(build_py):
    """Also copies the torch-native binding's sources and the JSON Schemas into the built package."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "vtalloc" / "allocator" / "_binding_src"
        for src in BINDING_SOURCES:
            dest = target / src.parent.relative_to(ROOT / "csrc") / src.name
            self.mkpath(str(dest.parent))
            self.copy_file(str(src), str(dest))
        schemas = Path(self.build_lib) / "vtalloc" / "client" / "_schemas"
        self.mkpath(str(schemas))
        for src in SCHEMAS:
            self.copy_file(str(src), str(schemas / src.name))


def usable_cores() -> int:
    """The cores this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ParallelBuildExt(build_ext):
    """Compiles one extension's sources on every usable core (``build_ext -j N`` sets another
    count). setuptools' own ``parallel`` option runs separate extensions at once and compiles
    each one's sources one after another, and pip's builds (wheel, editable) leave it unset; the
    core is one extension of ~45 sources, so it built on one core: 100 s against 50 s on two
    (measured 2026-11-27). Each source goes through its own ``compiler.compile`` call, so the
    flags and the up-to-date check are setuptools' own; a failure in any source fails the build."""

    def build_extension(self, ext):
        jobs = int(self.parallel) if self.parallel else usable_cores()
        serial = self.compiler.compile
        if jobs < 2 or len(ext.sources) < 2:
            return super().build_extension(ext)

        def compile_in_parallel(sources, *args, **kwargs):
            with ThreadPoolExecutor(jobs) as pool:
                objects = list(pool.map(lambda source: serial([source], *args, **kwargs), sources))
            return [obj for objs in objects for obj in objs]

        self.compiler.compile = compile_in_parallel
        try:
            return super().build_extension(ext)
        finally:
            self.compiler.compile = serial


class PlatformWheel(bdist_wheel):
    """Tags the wheel py3-none-<platform>: the core is loaded with ctypes and uses no CPython
    API, so one wheel serves every Python 3 (the library's file name keeps the suffix of the
    Python that built it; the loader finds it by glob, _native.library_path)."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


# Symbols the core takes from glibc and libstdc++ in the versions glibc 2.28 / GCC 8 export, so the
# wheel is manylinux_2_28 when built on a current Linux (csrc/compat/glibc_symbols.cpp; docs/packaging.md).
GLIBC_COMPAT_WRAPPED = ("dlopen", "dlsym", "dladdr", "dlclose", "pthread_once", "pthread_sigmask", "log2", "fstat",
                        "_ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE",
                        "_ZSt28__throw_bad_array_new_lengthv", "__libc_single_threaded")


def glibc_compat() -> tuple[list[str], list[str]]:
    """(compile args, link args) for the old symbol versions: on x86_64 glibc Linux only, and not
    when VTALLOC_NO_GLIBC_COMPAT=1 (a build for this machine alone)."""
    import platform

    if (platform.system() != "Linux" or platform.machine() != "x86_64" or platform.libc_ver()[0] != "glibc"
            or os.environ.get("VTALLOC_NO_GLIBC_COMPAT") == "1"):
        return [], []
    return ["-DVTA_GLIBC_COMPAT"], [f"-Wl,--wrap={name}" for name in GLIBC_COMPAT_WRAPPED]


COMPAT_COMPILE, COMPAT_LINK = glibc_compat()

setup(
    cmdclass={"build_py": BuildPyWithBindingSources, "build_ext": ParallelBuildExt, "bdist_wheel": PlatformWheel},
    ext_modules=[
        Extension(
            "vtalloc.allocator._vtalloc",
            sources=sources,
            include_dirs=["csrc", "csrc/include"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-g0", *COMPAT_COMPILE],
            extra_link_args=COMPAT_LINK,
            libraries=["dl", "pthread"],
        )
    ],
)
