"""The project's layer rules, and the import graphs they are checked against.

Owns: the layer tables of docs/design.md ("Layers") as data, and readers that build the
import graph of the Python packages (every import statement, inside functions included)
and the include graph of csrc/.
Invariants: a rule is a function of the two names only (no file is special-cased by path
outside these tables); a module or directory the tables do not know is itself a finding,
so a new package cannot slip past the check unranked.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"allocator": "vtalloc.allocator", "server": "vtalloc.server", "client": "vtalloc.client", "vtalloc": "vtalloc"}

# Python layers, lowest first. A module's layer is that of the longest prefix listed.
# The torch glue (the vtalloc.allocator.torch package, all of it) sits above the allocator core; the wire (protocol and generated stubs) is
# what server and client both speak; the client library reaches the daemon only through it.
PY_LAYERS: tuple[tuple[str, ...], ...] = (
    ("vtalloc.allocator",),
    ("vtalloc.allocator.torch",),
    ("vtalloc.server.protocol", "vtalloc.server.proto"),
    ("vtalloc.server",),
    ("vtalloc.client",),
    ("vtalloc.client.cli", "vtalloc.client.commands_service", "vtalloc.client.commands_common",
     "vtalloc.client.commands_serve", "vtalloc.client.commands_stats", "vtalloc.client.commands_pages",
     "vtalloc.client.commands_quota", "vtalloc.client.commands_evict", "vtalloc.client.commands_health",
     "vtalloc.client.__main__", "vtalloc.__main__"),
)
# Modules of a layer that may import only these prefixes of a lower layer's package.
PY_ONLY_THROUGH: dict[str, tuple[str, ...]] = {
    # The client library (everything in vtalloc.client but the CLI) talks to the daemon only
    # over the wire; the CLI may start the daemon (`vtalloc serve`).
    "vtalloc.client": ("vtalloc.server.protocol", "vtalloc.server.proto"),
}
PY_ONLY_THROUGH_EXEMPT = PY_LAYERS[-1]  # the CLI: every module of its layer

# csrc directories, lowest first. compat/ (older glibc/libstdc++ symbol versions for the wheel,
# including nothing of vtalloc's) and include/ (the public C ABI types) are below everything;
# tests/ (native test programs) above everything. blocks/ holds the block records the policy
# keeps and the engine reads (BlockFacts), below both. Each testing/ room is test-facing code just
# above its parent: backend/testing/ (the backends' test and model code: conformance, cost
# model, fault injection, test kernels, the toy backend), space/testing/ (the address space's
# test hooks: TestingSpace and the extension it keeps in each space) and capi/testing/ (the
# test entry points of the C ABI: vta_debug_*, vta_test_*, the conformance report). No file
# outside a testing/ room includes one (csrc_testing_findings): production code reaches test
# code only through seams it declares itself (space/space_extension.hpp; the cost model's two
# declarations in backend.hpp). torch/ is the core library's torch glue (the shim's C ABI, the
# torch-native ABI, graph-private pools, capture parking, the c10 binding), above capi/.
# torch_binding/ is a library of its own (built against the user's torch at enable()); it calls
# the core through include/ only.
CSRC_LAYERS = ("compat", "include", "backend", "backend/testing", "vmm", "blocks", "alloc", "evict", "space",
               "space/testing", "capi", "capi/testing", "torch", "torch_binding", "tests")
# Rooms below csrc's top level: a file or include under one of these belongs to it, not to its parent.
CSRC_SUBROOMS = ("backend/testing", "space/testing", "capi/testing")
# The only directories that may define C ABI entry points (extern "C"): the core library's
# capi/ (and its test entry points, capi/testing/) and torch/ (the torch shim's and the torch-native ABI), and the torch binding's
# install.cpp (the entry points its own library exports).
# compat/ (csrc/compat/glibc_symbols.cpp) defines C-linkage names too, but hidden ones: the
# wrappers the linker's --wrap sends the core's glibc references to, never exported
# (tests/test_packaging.py checks the built library).
CSRC_C_ABI_DIRS = ("capi", "capi/testing", "torch", "torch_binding", "compat")
# A room that may include only these files of a lower room (an empty tuple: none). The eviction
# engine (evict/) includes nothing of the allocation policy (alloc/): the policy calls it through
# ResidencyPort and the engine reads the blocks as data (BlockFacts), both in blocks/, below the
# two; the engine never calls back into the policy (docs/design.md, "Layers";
# tests/test_one_way_loop.py checks the calls, this the includes).
CSRC_ONLY_THROUGH: dict[tuple[str, str], tuple[str, ...]] = {
    ("evict", "alloc"): (),
}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module / including file
    target: str  # imported module / included directory
    where: str  # file:line
    include: str = ""  # csrc: the included path as written ("blocks/block_facts.hpp")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    parts[0] = PACKAGES[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def python_edges(files: list[Path] | None = None) -> list[Edge]:
    """Every import of a vtalloc module, at module level or inside a function."""
    files = python_files() if files is None else files
    known = {module_name(p) for p in files}
    edges = []
    for path in files:
        mod = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, path.name == "__init__.py", node)
                # `from pkg import name` imports the module pkg.name when there is one.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for t in targets:
                if t.startswith("vtalloc.") and t != mod:
                    edges.append(Edge(mod, t, where))
    return edges


def python_layer(module: str) -> int:
    best, layer = -1, -1
    for i, prefixes in enumerate(PY_LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    return layer


def python_findings(edges: list[Edge]) -> list[str]:
    out = []
    for e in edges:
        src, dst = python_layer(e.source), python_layer(e.target)
        if src < 0 or dst < 0:
            out.append(f"{e.where}: {e.source} -> {e.target}: a module no layer names")
        elif dst > src:
            out.append(f"{e.where}: {e.source} (layer {src}) imports {e.target} (layer {dst}), a higher layer")
        for pkg, through in PY_ONLY_THROUGH.items():
            inside = e.source == pkg or e.source.startswith(pkg + ".")
            exempt = any(e.source == x or e.source.startswith(x + ".") for x in PY_ONLY_THROUGH_EXEMPT)
            if inside and not exempt and e.target.startswith("vtalloc.server") and not any(
                e.target == t or e.target.startswith(t + ".") for t in through
            ):
                out.append(f"{e.where}: {e.source} reaches into {e.target}; the client library speaks to the "
                           f"daemon only through {', '.join(through)}")
    return list(dict.fromkeys(out))  # one finding per line, however many names it imports


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def csrc_files() -> list[Path]:
    return sorted(p for p in (ROOT / "csrc").rglob("*") if p.suffix in {".cpp", ".hpp", ".h"})


def csrc_room(relative: str) -> str:
    """The room of a path relative to csrc/ ("backend/testing/x.hpp" -> "backend/testing")."""
    for sub in CSRC_SUBROOMS:
        if relative.startswith(sub + "/"):
            return sub
    return relative.split("/")[0]


def csrc_edges(files: list[Path] | None = None) -> list[Edge]:
    edges = []
    for path in csrc_files() if files is None else files:
        src = csrc_room(path.relative_to(ROOT / "csrc").as_posix())
        text = path.read_text()
        for m in _INCLUDE.finditer(text):
            target = m.group(1)
            # "vtalloc/x.h" is the public header directory csrc/include/vtalloc.
            dst = "include" if target.startswith("vtalloc/") else csrc_room(target)
            line = text.count("\n", 0, m.start()) + 1
            edges.append(Edge(src, dst, f"{path.relative_to(ROOT)}:{line}", target))
    return edges


def csrc_findings(edges: list[Edge]) -> list[str]:
    out = []
    for e in edges:
        if e.source not in CSRC_LAYERS or e.target not in CSRC_LAYERS:
            out.append(f"{e.where}: {e.source}/ -> {e.target}/: a directory no layer names")
        elif CSRC_LAYERS.index(e.target) > CSRC_LAYERS.index(e.source):
            out.append(f"{e.where}: {e.source}/ includes {e.target}/, a higher layer")
    return out


def csrc_through_findings(edges: list[Edge]) -> list[str]:
    """An include of a lower room's file that CSRC_ONLY_THROUGH does not allow that room."""
    out = []
    for e in edges:
        allowed = CSRC_ONLY_THROUGH.get((e.source, e.target))
        if allowed is not None and e.include not in allowed:
            only = ", ".join(allowed) or "nothing"
            out.append(f"{e.where}: {e.source}/ includes {e.include}; it may include only {only} of {e.target}/")
    return out


def is_test_facing(path: str) -> bool:
    """A csrc path (a file, or an include as written) under a testing/ directory at any depth."""
    return "testing" in Path(path).parts[:-1]


def csrc_testing_findings(edges: list[Edge]) -> list[str]:
    """An include of a file under a testing/ directory by a file under none (csrc/tests/, the
    native test programs, aside): production code includes nothing test-facing. Read from the
    paths, not the room tables, so a new testing/ directory is covered before it is ranked."""
    out = []
    for e in edges:
        source = e.where.rsplit(":", 1)[0]
        if is_test_facing(e.include) and not is_test_facing(source) and not source.startswith("csrc/tests/"):
            out.append(f"{e.where}: includes {e.include}, test-facing code; only files under a testing/ directory may")
    return out


_C_ABI = re.compile(r'^\s*extern\s+"C"', re.M)


def c_abi_findings(files: list[Path] | None = None) -> list[str]:
    """extern "C" outside CSRC_C_ABI_DIRS (the public header's own guard aside)."""
    out = []
    for path in csrc_files() if files is None else files:
        top = csrc_room(path.relative_to(ROOT / "csrc").as_posix())
        if top in CSRC_C_ABI_DIRS or top in ("include", "tests"):
            continue
        for m in _C_ABI.finditer(path.read_text()):
            line = path.read_text().count("\n", 0, m.start()) + 1
            out.append(f"{path.relative_to(ROOT)}:{line}: a C ABI entry point outside {', '.join(CSRC_C_ABI_DIRS)}/")
    return out
