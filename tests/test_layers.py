"""Imports point down only, in Python and in csrc/; no import cycle; no oversized file.

The rules are the tables in tests/helpers/layers.py (docs/design.md, "Layers", shows them).
Each check is first run on a small made-up graph that breaks it, so a checker that has
stopped seeing anything fails here rather than passing quietly.
"""

from __future__ import annotations

from pathlib import Path

from helpers.layers import (
    ROOT,
    Edge,
    c_abi_findings,
    csrc_edges,
    csrc_findings,
    csrc_room,
    csrc_through_findings,
    cycles,
    module_name,
    python_edges,
    python_files,
    python_findings,
    python_layer,
)

MAX_LINES = 500
LONG_FILE_MARK = "Why this file is long:"


def _report(findings: list[str]) -> str:
    return "\n".join(findings)


def test_checker_sees_upward_imports_and_cycles():
    made_up = [
        Edge("vtalloc.allocator.address_space", "vtalloc.client.service_space", "a.py:1"),  # core -> client
        Edge("vtalloc.allocator.torch.activation_paging", "vtalloc.allocator.torch.enabling", "b.py:1"),  # glue, one layer
        Edge("vtalloc.allocator.torch.enabling", "vtalloc.allocator.torch.activation_paging", "c.py:1"),  # ... and back
        Edge("vtalloc.client.session", "vtalloc.server.daemon", "d.py:1"),  # library -> daemon internals
        Edge("vtalloc.client.cli", "vtalloc.server.daemon", "e.py:1"),  # the CLI may start the daemon
        Edge("vtalloc.allocator.config", "vtalloc.widgets", "f.py:1"),  # unranked
    ]
    findings = python_findings(made_up)
    assert any(f.startswith("a.py:1") and "higher layer" in f for f in findings)
    assert any(f.startswith("d.py:1") and "only through" in f for f in findings)
    assert any(f.startswith("f.py:1") and "no layer" in f for f in findings)
    assert not any(f.startswith(("b.py", "c.py", "e.py")) for f in findings)
    assert cycles(made_up) == [["vtalloc.allocator.torch.activation_paging", "vtalloc.allocator.torch.enabling"]]
    assert python_layer("vtalloc.server.protocol.side_channel") < python_layer("vtalloc.server.daemon")


def test_checker_sees_upward_includes_and_stray_c_abi(tmp_path: Path):
    made_up = [Edge("alloc", "evict", "x.cpp:3"), Edge("evict", "alloc", "y.cpp:3"),
               Edge("backend", "capi", "z.cpp:9"), Edge("capi", "include", "w.cpp:1"), Edge("gadgets", "vmm", "v.cpp:1"),
               Edge("backend", "backend/testing", "u.cpp:2"), Edge("capi", "torch", "t.cpp:4"),
               Edge("torch", "capi", "s.cpp:4"), Edge("space", "backend/testing", "r.cpp:5")]
    findings = csrc_findings(made_up)
    assert [f.split(":")[0] for f in findings] == ["x.cpp", "z.cpp", "v.cpp", "u.cpp", "t.cpp"]
    assert csrc_room("backend/testing/cost_model.hpp") == "backend/testing"
    assert csrc_room("backend/host_backend.cpp") == "backend"
    stray = ROOT / "csrc" / "backend" / f"_layer_probe_{tmp_path.name}.cpp"
    stray.write_text('// probe\nextern "C" int vta_probe(void) { return 0; }\n')
    try:
        assert any("_layer_probe_" in f for f in c_abi_findings([stray]))
    finally:
        stray.unlink()


def test_python_imports_point_down():
    edges = python_edges()
    assert len(edges) > 50, "the import reader found almost nothing: is it still reading the packages?"
    assert not python_findings(edges), _report(python_findings(edges))


def test_python_has_no_import_cycle():
    found = cycles(python_edges())
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_csrc_includes_point_down():
    edges = csrc_edges()
    assert len(edges) > 30
    assert not csrc_findings(edges), _report(csrc_findings(edges))


def test_evict_includes_nothing_of_alloc():
    """evict/ includes nothing of alloc/: the policy calls the engine through blocks/
    residency_port.hpp and the engine reads blocks/block_facts.hpp (tests/test_one_way_loop.py
    checks the calls). The check is first shown stray includes."""
    made_up = [Edge("evict", "alloc", "x.cpp:2", "alloc/page_users.hpp"),
               Edge("evict", "alloc", "y.cpp:3", "alloc/live_allocations.hpp"),
               Edge("space", "alloc", "z.cpp:4", "alloc/alloc_policy.hpp"), Edge("evict", "blocks", "w.cpp:5", "blocks/x.hpp")]
    assert [f.split(":")[0] for f in csrc_through_findings(made_up)] == ["x.cpp", "y.cpp"]
    edges = csrc_edges()
    assert any(e.source == "evict" and e.include == "blocks/block_facts.hpp" for e in edges)  # the reader sees them
    assert not csrc_through_findings(edges), _report(csrc_through_findings(edges))


def test_c_abi_is_defined_only_in_capi():
    assert not c_abi_findings(), _report(c_abi_findings())


def _source_files() -> list[Path]:
    files = []
    for top in ("allocator", "server", "client", "tests", "benchmarks"):
        files += [p for p in (ROOT / top).rglob("*.py") if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]
    files += [p for p in (ROOT / "csrc").rglob("*") if p.suffix in {".cpp", ".hpp", ".h"}]
    return sorted(files)


def test_no_long_file_without_a_reason():
    files = _source_files()
    assert len(files) > 100
    long = []
    for path in files:
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and not any(LONG_FILE_MARK in line for line in lines[:20]):
            long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
    assert not long, (f"over {MAX_LINES} lines with no '{LONG_FILE_MARK}' line at the top:\n" + _report(long))


def _imports_torch_at_module_level(path: Path) -> bool:
    import ast

    for node in ast.parse(path.read_text(), str(path)).body:  # top-level statements only
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def test_torch_glue_is_one_package(tmp_path: Path):
    """The torch glue is vtalloc.allocator.torch (allocator/torch/), all of it: no core module
    imports torch at import, and the glue's folder is what the layer table ranks as glue."""
    made_up = tmp_path / "glue.py"
    made_up.write_text("import os\nimport torch.nn as nn\n")
    assert _imports_torch_at_module_level(made_up)  # the check sees a stray glue module
    core = [p for p in (ROOT / "allocator").glob("*.py")]
    assert core and not [p.name for p in core if _imports_torch_at_module_level(p)]
    glue = sorted((ROOT / "allocator" / "torch").glob("*.py"))
    assert glue and all(python_layer(module_name(p)) == python_layer("vtalloc.allocator.torch") for p in glue)
    assert python_layer("vtalloc.allocator.torch") == python_layer("vtalloc.allocator") + 1


def test_every_package_folder_ships():
    """A folder with an __init__.py under the packages is listed in pyproject.toml's packages
    (setuptools' explicit list: a folder missing from it would be missing from the wheel)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(p) for p in python_files() if p.name == "__init__.py"}
    assert folders - listed == set()
