"""vtalloc as a packager and a user installing it meet it: ``python -m vtalloc.client``, the
JSON Schemas readable from the installed package, typing markers, and an sdist that holds
every source its build needs.

Owns: checks of the packaging (MANIFEST.in, pyproject.toml, setup.py's copies) and of
vtalloc.client.schemas. The sdist is built here (no isolation: the venv's setuptools) and
listed, not installed: CI (.ci/packaging) installs one in a fresh venv and runs the CLI.
Invariants: every check reads the files the build reads, so a header added to csrc/ without
the manifest covering it fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from vtalloc.allocator import InvalidArgumentError
from vtalloc.client import schemas

ROOT = Path(__file__).resolve().parents[1]


def test_python_m_vtalloc_client_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "vtalloc.client", "--version"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("vtalloc "), r.stderr
    bad = subprocess.run([sys.executable, "-m", "vtalloc.client", "no-such-command"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2, bad.stderr  # the CLI's usage-error code, as from the console script


def test_schemas_are_readable_from_the_package():
    on_disk = sorted(p.name for p in (ROOT / "schemas").glob("*.schema.json"))
    assert schemas.names() == on_disk
    for name in on_disk:
        assert schemas.load(name) == json.loads((ROOT / "schemas" / name).read_text())
    assert schemas.for_document({"schema": "vtalloc.proc-stats/v1"})["title"].startswith("vtalloc stats --pid")
    with pytest.raises(InvalidArgumentError, match="no schema"):
        schemas.load("nope")
    with pytest.raises(InvalidArgumentError, match="not a vtalloc document schema"):
        schemas.file_for("something/v1")


def test_every_schema_has_an_absolute_id_ending_with_its_file_name():
    ids = schemas.resources_by_id()
    assert len(ids) == len(schemas.names())
    for name in schemas.names():
        schema_id = schemas.load(name)["$id"]
        assert re.fullmatch(r"https://[a-z.]+/schemas/" + re.escape(name), schema_id), schema_id


def test_refs_resolve_through_the_ids_alone():
    """A validator given only the schemas keyed by $id (no files) resolves their relative $refs."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    registry = Registry().with_resources((i, Resource.from_contents(s)) for i, s in schemas.resources_by_id().items())
    demo = schemas.load("proc-stats")
    assert not Draft202012Validator(demo, registry=registry).is_valid({"schema": "vtalloc.proc-stats/v1", "spaces": [{}]})
    ref_target = registry.resolver(demo["$id"]).lookup("space-stats.schema.json").contents
    assert ref_target["$id"].endswith("/space-stats.schema.json")


def test_every_package_is_marked_typed():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for pkg, folder in (("vtalloc.allocator", "allocator"), ("vtalloc.server", "server"), ("vtalloc.client", "client")):
        assert (ROOT / folder / "py.typed").is_file() and "py.typed" in data[pkg]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> tarfile.TarFile:
    out = tmp_path_factory.mktemp("sdist")
    r = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named build" in r.stderr:
        pytest.skip("the build package is not installed (pip install build)")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = out.glob("vtalloc-*.tar.gz")
    return tarfile.open(path)


def _members(sdist: tarfile.TarFile) -> set[str]:
    return {m.name.split("/", 1)[1] for m in sdist.getmembers() if m.isfile() and "/" in m.name}


def test_the_sdist_holds_every_source_the_build_and_the_binding_need(sdist):
    """It carried no .hpp/.h, no torch_binding/ and no schemas/: its build failed at alloc_policy.hpp."""
    files = _members(sdist)
    tracked = subprocess.run(["git", "ls-files", "csrc", "schemas", "deploy"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    needed = [f for f in tracked if re.search(r"\.(cpp|hpp|h|json)$|^deploy/", f)]
    assert any(f.endswith("alloc_policy.hpp") for f in needed)
    missing = sorted(set(needed) - files)
    assert not missing, f"not in the sdist: {missing}"
    assert {"LICENSE", "README.md", "setup.py", "pyproject.toml", "client/py.typed"} <= files


def test_the_sdist_metadata_is_spdx_licensed(sdist):
    pkg_info = sdist.extractfile(next(m for m in sdist.getmembers() if m.name.endswith("/PKG-INFO"))).read().decode()
    assert "License-Expression: Apache-2.0" in pkg_info and "License-File: LICENSE" in pkg_info
    assert "Classifier: Typing :: Typed" in pkg_info


def test_a_plain_install_pulls_neither_torch_nor_cuda_python(sdist):
    """A node running only the daemon installed torch and cuda-python (GBs) because they were
    dependencies; now they are the torch and cuda extras, torch without an upper cap (a torch
    newer than the binding was checked against falls back in enable(), it is not refused)."""
    pkg_info = sdist.extractfile(next(m for m in sdist.getmembers() if m.name.endswith("/PKG-INFO"))).read().decode()
    requires = [ln.split(":", 1)[1].strip() for ln in pkg_info.splitlines() if ln.startswith("Requires-Dist:")]
    plain = [r for r in requires if "extra ==" not in r]
    assert plain and not [r for r in plain if re.match(r"(torch|cuda-python)\b", r)], plain
    assert 'torch>=2.3; extra == "torch"' in requires and 'cuda-python>=12.3; extra == "cuda"' in requires
    assert not [r for r in requires if r.startswith("torch") and "<" in r.split(";")[0]], requires


def test_the_sdist_carries_the_tests_and_what_they_read(sdist):
    """The `test` extra is published, so the tests ship: helpers, the benchmarks they import and
    the traces they replay, the CI scripts they read."""
    files = _members(sdist)
    tracked = subprocess.run(["git", "ls-files", "tests", "benchmarks/traces", "vtalloc", ".ci", "scripts"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    missing = sorted(set(tracked) - files)
    assert not missing, f"not in the sdist: {missing}"
    assert "tests/conftest.py" in files and "tests/helpers/service.py" in files


def test_version_and_python_m_vtalloc():
    import vtalloc

    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", vtalloc.__version__)
    r = subprocess.run([sys.executable, "-m", "vtalloc", "--version"], capture_output=True, text=True, timeout=120,
                       cwd="/")
    assert r.returncode == 0 and r.stdout.strip() == f"vtalloc {vtalloc.__version__}", r.stderr
    from importlib.metadata import version

    assert version("vtalloc") == vtalloc.__version__  # pyproject.toml reads it from vtalloc/__init__.py


# manylinux_2_28's limits for x86_64 (PEP 600; auditwheel's policy file): glibc 2.28 and GCC 8's
# libstdc++ (GLIBCXX_3.4.25, CXXABI_1.3.11).
MANYLINUX_2_28 = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 25), "CXXABI": (1, 3, 11)}


def _needed_versions(library: str) -> dict[str, list[tuple[int, ...]]]:
    out = subprocess.run(["objdump", "-T", library], capture_output=True, text=True, check=True).stdout
    found: dict[str, list[tuple[int, ...]]] = {}
    for kind, version in re.findall(r"\*UND\*\s+\S+\s+\(?(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)\)?\s", out):
        found.setdefault(kind, []).append(tuple(int(x) for x in version.split(".")))
    return found


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86_64 Linux wheels only")
def test_the_core_library_needs_nothing_newer_than_manylinux_2_28():
    """The wheel was manylinux_2_35 (dlopen@GLIBC_2.34, condition_variable::wait@GLIBCXX_3.4.30,
    ...): RHEL 8/9-family hosts could not install it. The core now takes those symbols in the
    versions glibc 2.28 / GCC 8 export (csrc/compat/glibc_symbols.cpp); this reads the versions the
    built library needs, as auditwheel does (scripts/build_wheels.sh then refuses a newer tag)."""
    import shutil

    from vtalloc.allocator import _native

    if shutil.which("objdump") is None:
        pytest.skip("no objdump (binutils)")
    needed = _needed_versions(_native.library_path())
    assert needed.get("GLIBC"), "no versioned glibc symbol read: the check would be vacuous"
    too_new = {kind: sorted({v for v in versions if v > MANYLINUX_2_28[kind]})
               for kind, versions in needed.items() if any(v > MANYLINUX_2_28[kind] for v in versions)}
    assert not too_new, f"symbol versions newer than manylinux_2_28: {too_new}"
    out = subprocess.run(["objdump", "-T", _native.library_path()], capture_output=True, text=True).stdout
    assert "__wrap_" not in out   # the wrappers are the library's own, never exported
