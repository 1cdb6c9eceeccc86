"""benchmarks/ shows its tools: scripts at the top, their shared code in benchmarks/lib/, no file
over 600 lines, no import cycle, every script in benchmarks/README.md with the question it answers.

Owns: the layout rules of benchmarks/ (issue 41) and their checks, each a function of a folder so
it is first run on a small made-up folder that breaks it (a checker that stopped seeing anything
fails here rather than passing quietly).
Invariants: a script is a top-level .py with a ``__name__ == "__main__"`` block (run as
``python benchmarks/<name>.py``); everything else is library code and lives in a package below
(lib/, reliability/); imports are read from the source (every ``import``, at any depth, so a
function-level import closing a cycle counts) and resolved as a script resolves them, with
benchmarks/ first on sys.path; the README's script table is the list of scripts, one row each.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
MAX_LINES = 600
LIBRARY = "lib"  # the package of the scripts' shared code
MAIN_GUARD = re.compile(r"""^if __name__ == ["']__main__["']:""", re.M)
# A row of the README's script table: | `name.py` | the question it answers |
SCRIPT_ROW = re.compile(r"^\|\s*`([\w.]+\.py)`\s*\|\s*(.*?)\s*\|", re.M)


def python_files(bench: Path) -> list[Path]:
    return sorted(p for p in bench.rglob("*.py") if "__pycache__" not in p.parts)


def is_script(path: Path) -> bool:
    return bool(MAIN_GUARD.search(path.read_text()))


def long_files(bench: Path, limit: int = MAX_LINES) -> list[str]:
    return [f"{p.relative_to(bench)}: {n} lines" for p in python_files(bench)
            if (n := len(p.read_text().splitlines())) > limit]


def misplaced(bench: Path) -> list[str]:
    """Library modules at the top level, and scripts inside the library package."""
    found = [f"{p.name}: no __main__ block, so library code: it belongs in {LIBRARY}/"
             for p in sorted(bench.glob("*.py")) if not is_script(p)]
    found += [f"{p.relative_to(bench)}: a script inside the library" for p in sorted((bench / LIBRARY).rglob("*.py"))
              if is_script(p)]
    return found


def readme_rows(bench: Path) -> dict[str, str]:
    return dict(SCRIPT_ROW.findall((bench / "README.md").read_text()))


def scripts_not_in_readme(bench: Path) -> list[str]:
    rows = readme_rows(bench)
    missing = [f"{p.name}: no row in README.md's script table" for p in sorted(bench.glob("*.py"))
               if is_script(p) and p.name not in rows]
    missing += [f"{name}: its README row has no question" for name, question in rows.items()
                if (bench / name).exists() and len(question.split()) < 3]
    return missing


def _module_file(bench: Path, name: str) -> Path | None:
    base = bench.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def import_graph(bench: Path) -> dict[Path, set[Path]]:
    """Each benchmarks file -> the benchmarks files it imports (others' imports are left out)."""
    graph: dict[Path, set[Path]] = {}
    for path in python_files(bench):
        targets: set[Path] = set()
        package = ".".join(path.relative_to(bench).parent.parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # relative: from the file's own package
                    parts = package.split(".") if package else []
                    module = ".".join([*parts[:len(parts) - node.level + 1], *([module] if module else [])])
                names = [module, *(f"{module}.{a.name}" for a in node.names)]
            for name in names:
                if name and (target := _module_file(bench, name)) is not None and target != path:
                    targets.add(target)
        graph[path] = targets
    return graph


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """One path per import cycle found by a depth-first walk (empty: the graph is acyclic)."""
    found: list[list[Path]] = []
    state: dict[Path, int] = {}  # 1: on the walk's stack, 2: done
    stack: list[Path] = []

    def visit(node: Path) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def _cycle_report(bench: Path) -> list[str]:
    return [" -> ".join(str(p.relative_to(bench)) for p in c) for c in cycles(import_graph(bench))]


# -- the checks, first on a made-up folder that breaks each ------------------------------------------

def _made_up(tmp_path: Path) -> Path:
    bench = tmp_path / "benchmarks"
    (bench / LIBRARY).mkdir(parents=True)
    (bench / "pkg").mkdir()
    (bench / LIBRARY / "__init__.py").write_text('"""lib."""\n')
    (bench / LIBRARY / "shared.py").write_text("import os\n")
    (bench / "pkg" / "__init__.py").write_text("")
    (bench / "pkg" / "a.py").write_text("from pkg.b import x\n")
    (bench / "pkg" / "b.py").write_text("def x():\n    from pkg import a\n")  # a function-level import closes it
    main = 'if __name__ == "__main__":\n    pass\n'
    (bench / "tool.py").write_text("from lib.shared import os\n" + main)
    (bench / "other.py").write_text("from lib import shared\n" + "\n" * MAX_LINES + main)
    (bench / "helper.py").write_text("X = 1\n")  # library code at the top level
    (bench / "README.md").write_text("| script | question |\n|---|---|\n| `tool.py` | what does a tool cost? |\n"
                                     "| `other.py` | - |\n")
    return bench


def test_the_checks_see_each_broken_rule(tmp_path: Path):
    bench = _made_up(tmp_path)
    assert long_files(bench) == ["other.py: 603 lines"]
    assert misplaced(bench) == ["helper.py: no __main__ block, so library code: it belongs in lib/"]
    assert scripts_not_in_readme(bench) == ["other.py: its README row has no question"]
    assert _cycle_report(bench) == ["pkg/a.py -> pkg/b.py -> pkg/a.py"]
    graph = import_graph(bench)
    assert graph[bench / "tool.py"] == {bench / LIBRARY / "shared.py"}
    (bench / "other.py").unlink()
    assert scripts_not_in_readme(bench) == [] and long_files(bench) == []
    (bench / "late.py").write_text('if __name__ == "__main__":\n    pass\n')
    assert scripts_not_in_readme(bench) == ["late.py: no row in README.md's script table"]
    (bench / LIBRARY / "runner.py").write_text('if __name__ == "__main__":\n    pass\n')
    assert misplaced(bench)[-1] == "lib/runner.py: a script inside the library"


def test_no_benchmarks_file_over_600_lines():
    assert len(python_files(BENCH)) > 30
    assert not long_files(BENCH), "\n".join(long_files(BENCH))


def test_scripts_at_the_top_and_library_code_in_lib():
    assert (BENCH / LIBRARY / "__init__.py").is_file()
    assert not misplaced(BENCH), "\n".join(misplaced(BENCH))


def test_every_script_is_in_the_readme_with_its_question():
    scripts = [p for p in BENCH.glob("*.py") if is_script(p)]
    assert len(scripts) > 20
    assert not scripts_not_in_readme(BENCH), "\n".join(scripts_not_in_readme(BENCH))
    stale = [name for name in readme_rows(BENCH) if not (BENCH / name).exists() and not (BENCH / LIBRARY / name).exists()]
    assert not stale, f"README.md's tables name files that are not there: {stale}"


def test_benchmarks_have_no_import_cycle():
    graph = import_graph(BENCH)
    assert sum(len(t) for t in graph.values()) > 30  # the reader resolves the scripts' imports
    assert not _cycle_report(BENCH), "\n".join(_cycle_report(BENCH))
