"""Build the C++ core (csrc/) into one shared library inside vtalloc.allocator.

Only a C++17 compiler is needed: no nvcc, no CUDA headers, no libcuda at link time (the
cuda backend resolves the driver at run time). The library is loaded with ctypes, not
imported, so it exports only the C ABI of csrc/include/vtalloc/vtalloc.h.
"""

from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).parent
sources = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").rglob("*.cpp") if "tests" not in p.parts)

setup(
    ext_modules=[
        Extension(
            "vtalloc.allocator._vtalloc",
            sources=sources,
            include_dirs=["csrc", "csrc/include"],
            language="c++",
            extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-g0"],
            libraries=["dl", "pthread"],
        )
    ],
)
