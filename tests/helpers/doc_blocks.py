"""The fenced code blocks of the project's Markdown docs, and how each is to be checked.

Owns: finding the blocks (``doc_blocks()``) and the markers that say what a block is.
Invariants: every ``python``, ``bash`` or ``sh`` block is run by tests/test_docs_examples.py
unless it is marked, and a mark always carries its reason, so a doc cannot drift silently:

- a first line ``# needs a GPU`` (any text may follow): the block runs only where a CUDA device
  is found (the test is marked ``gpu``);
- ``<!-- doc-test: skip: REASON -->`` on the line before the fence: never run (installs
  packages, runs for minutes, ...), the reason is the skip message;
- ``<!-- doc-test: daemon -->``: the block runs a daemon in the foreground (``vtalloc serve``):
  it must print its JSON ready line, then stop cleanly on SIGTERM;
- ``<!-- doc-test: with-daemon -->``: the block talks to a daemon, so a host-backend one is
  started on the block's default socket first (as the page's prose says to) and stopped after;
- ``json`` blocks must parse; ``pycon`` (an interpreter session) and ``text``/unlabelled
  blocks are shown, not run; ``ini`` blocks are checked by the tests that own them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROOT", "DOC_FILES", "Block", "doc_blocks", "GPU_MARK", "RUNNABLE"]

ROOT = Path(__file__).resolve().parents[2]
# The Markdown a reader of the repository meets: the README, docs/ and the two figure files.
DOC_FILES = ("README.md", "RELIABILITY.md", "BENCHMARKS.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))

GPU_MARK = "# needs a GPU"
RUNNABLE = ("python", "bash", "sh")
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<mode>skip|daemon|with-daemon)\s*(?::\s*(?P<reason>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: str          # relative to the repository root
    line: int          # 1-based line of the opening fence
    lang: str          # the info string's first word ("" when none)
    code: str          # the block's text, dedented by the fence's indent
    skip_reason: str | None  # from a doc-test: skip comment before the fence
    mode: str = "run"        # "run", "skip", "daemon" or "with-daemon" (the doc-test comment)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def needs_gpu(self) -> bool:
        first = self.code.lstrip().splitlines()[0] if self.code.strip() else ""
        return first.startswith(GPU_MARK)


def _blocks_of(rel: str) -> list[Block]:
    lines = (ROOT / rel).read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m["indent"]), m["fence"], m["info"].strip()
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i >= len(lines):
            raise ValueError(f"{rel}:{start + 1}: code block never closed")
        prev = lines[start - 1] if start else ""
        mark = _MARK.match(prev)
        if mark is None and "doc-test" in prev:
            raise ValueError(f"{rel}:{start}: unknown doc-test mark {prev.strip()!r}")
        mode = mark["mode"] if mark else "run"
        reason = (mark["reason"] or "") if mode == "skip" else None
        out.append(Block(rel, start + 1, info.split()[0] if info else "", "\n".join(body) + "\n", reason, mode))
        i += 1
    return out


def doc_blocks() -> list[Block]:
    """Every fenced block of DOC_FILES, in file order."""
    return [b for rel in DOC_FILES for b in _blocks_of(rel)]
