"""Retired words stay retired: the glossary's dropped words in the docs and the sources' text.

Owns: a check over the prose of the docs (README.md, BENCHMARKS.md, RELIABILITY.md, docs/,
benchmarks/'s notes) and the text of every source file (Python, C++, shell, deploy files),
comments and strings included, that no word docs/design.md's glossary retires is used again:
"slab" (small allocations are blocks like any other, on shared pages), and the plurals "victim
policies" / "victim choices" (one victim policy, the core's; the other choices have words of their own).
Invariants: a retired word may still be *named*: written alone in quotes (``"slab"``, as the
glossary's sentence that retires it and a historic result's column name do); any other use is a
finding naming file and line. Raw result files (benchmarks/results/) are data and are not read;
the glossary checks themselves name the words they look for and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RETIRED = {
    "slab": "no slabs: small allocations are blocks like any other, on shared pages (docs/design.md, Glossary)",
    "victim policies": "one victim policy, the core's; the other choices are the give-back order, the pressure "
                       "targets and evict-behind (docs/design.md, Glossary)",
    "victim choices": "say which: victim policy, give-back order, pressure targets or evict-behind",
}
SOURCE_DIRS = ("allocator", "server", "client", "csrc", "benchmarks", "tests", "docs", "deploy", "scripts", "schemas")
SUFFIXES = {".md", ".py", ".cpp", ".hpp", ".h", ".sh", ".yaml", ".yml", ".toml", ".proto", ".json", ".service",
            ".conf"}
SKIPPED = ("benchmarks/results/", "tests/test_glossary")


def _files() -> list[Path]:
    files = [p for p in ROOT.glob("*.md")] + [ROOT / "pyproject.toml", ROOT / "setup.py"]
    for top in SOURCE_DIRS:
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    rels = {p: p.relative_to(ROOT).as_posix() for p in files}
    return sorted(p for p, rel in rels.items()
                  if not rel.startswith(SKIPPED) and "__pycache__" not in rel and not rel.endswith(("_pb2.py", "_pb2_grpc.py")))


def findings(rel: str, text: str) -> list[str]:
    out = []
    for word, why in RETIRED.items():
        named = re.compile(rf"([\"'`]){word}s?\1", re.I)  # the word itself, quoted: named, not used
        used = re.compile(word, re.I)
        for n, line in enumerate(text.splitlines(), 1):
            if used.search(named.sub("", line)):
                out.append(f"{rel}:{n}: {line.strip()[:120]!r}: {why}")
    return out


def test_the_check_sees_a_retired_word_and_lets_it_be_named():
    cases = {
        "small tensors go to one-page slabs": 1,
        "def test_small_slabs(): pass": 1,
        "class SlabCache:": 1,
        "assert x, 'both on one slab page'": 1,
        "a quarter of the non-slab tensors": 1,
        '"Pool" alone is not used, nor "slab" (small allocations are blocks)': 0,
        '| "slab" (now "shared"): bytes / tensors |': 0,
        "the `slabs` key of an old result file": 0,
        "vtalloc has four victim policies; this is the one inside the core": 1,
        "It is one of the project's four Victim Choices": 1,
        'retired: "victim policies" and "victim choices"': 0,
        "the core's victim policy (LruPolicy)": 0,
    }
    for line, expected in cases.items():
        assert len(findings("x.md", line)) == expected, line


def test_no_retired_word_comes_back():
    files = _files()
    assert len(files) > 200 and ROOT / "docs" / "design.md" in files  # it is still reading the tree
    out = [f for p in files for f in findings(p.relative_to(ROOT).as_posix(), p.read_text(errors="replace"))]
    assert out == [], "\n".join(out)
