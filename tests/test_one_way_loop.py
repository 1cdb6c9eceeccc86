"""The allocation/eviction loop is one-way at run time (issue 41, third step).

The policy (csrc/alloc/) calls the eviction engine (csrc/evict/) through ResidencyPort; the
engine never calls back into the policy. What it must know of the blocks over a page (their
streams, whether they may be evicted or paused, which bytes hold data) it reads as data from
BlockFacts (csrc/blocks/), which the policy keeps current and which implements nothing of the
policy's. Checked here on the sources:

- no file of csrc/evict/ includes anything of csrc/alloc/;
- no file of csrc/evict/ names a type csrc/alloc/ declares, or a base class that a class of
  csrc/alloc/ derives from (a PageUsers-style callback: an interface the policy implements and
  the engine is handed), wherever that interface is declared;
- BlockFacts, what the engine reads, declares no virtual function: it is data, so no callback
  can hide behind it either.

Each check is first run on made-up sources that break it, so a checker that stopped seeing
anything fails here rather than passing quietly.
"""

from __future__ import annotations

import re
from helpers.layers import ROOT

CSRC = ROOT / "csrc"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_TYPE = re.compile(r"^([ \t]*)(?:class|struct)\s+([A-Za-z_]\w*)\b[^;]*?(?::\s*([^{]*))?\{", re.M)
_BASE = re.compile(r"(?:public|protected|private)?\s*(?:virtual\s+)?([A-Za-z_][\w:]*)")
_VIRTUAL = re.compile(r"\bvirtual\b")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def _code(text: str) -> str:
    return _COMMENT.sub("", text)


def _types_and_bases(sources: dict[str, str]) -> tuple[set[str], set[str]]:
    """The class/struct names these sources define at namespace scope (nested ones are the
    policy's own words), and the base classes any of theirs derive from."""
    names, bases = set(), set()
    for text in sources.values():
        for m in _TYPE.finditer(_code(text)):
            if not m.group(1):
                names.add(m.group(2))
            for part in (m.group(3) or "").split(","):
                b = _BASE.match(part.strip())
                if b and b.group(1):
                    bases.add(b.group(1).split("::")[-1])
    return names, bases


def one_way_findings(policy: dict[str, str], engine: dict[str, str]) -> list[str]:
    """What lets the engine (engine: path -> text) reach back into the policy (policy: path -> text)."""
    out = []
    names, bases = _types_and_bases(policy)
    for path, text in sorted(engine.items()):
        code = _code(text)
        for m in _INCLUDE.finditer(text):
            if m.group(1).startswith("alloc/"):
                out.append(f"{path}: includes {m.group(1)} (the engine includes nothing of the policy)")
        for word in sorted(names | bases):
            if re.search(rf"\b{re.escape(word)}\b", code):
                why = "an interface the policy implements" if word in bases else "a type of the policy"
                out.append(f"{path}: names {word}, {why}")
    return out


def _read(room: str) -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((CSRC / room).glob("*.[ch]pp"))}


def test_checker_sees_callbacks_back_into_the_policy():
    policy = {
        "alloc/users.hpp": "class PageUsers {\n public:\n  virtual bool evictable() const = 0;\n};\n",
        "alloc/policy.hpp": '#include "blocks/port.hpp"\nclass AllocPolicy final : public PageUsers, public Asker {\n};\n',
    }
    engine = {
        "evict/a.hpp": '#include "alloc/users.hpp"\n',  # an include of the policy's
        "evict/b.hpp": "struct E {\n  const PageUsers& users_;\n};\n",  # holds the policy's interface
        "evict/c.cpp": "void f(Asker& a) { a.ask(); }\n",  # an interface declared elsewhere the policy implements
        "evict/d.cpp": "// AllocPolicy, in a comment only\nint g();\n",
    }
    findings = one_way_findings(policy, engine)
    assert [f.split(":")[0] for f in findings] == ["evict/a.hpp", "evict/b.hpp", "evict/c.cpp"]
    assert "Asker" in findings[2] and "interface the policy implements" in findings[2]


def test_engine_never_reaches_back_into_the_policy():
    policy, engine = _read("alloc"), _read("evict")
    assert "csrc/alloc/alloc_policy.hpp" in policy and "csrc/evict/residency.hpp" in engine
    names, _ = _types_and_bases(policy)
    assert {"AllocPolicy", "FreeSpace", "CachedHandles"} <= names  # the reader sees the policy's types
    findings = one_way_findings(policy, engine)
    assert not findings, "\n".join(findings)


def test_engine_reads_the_blocks_as_data():
    """The engine is handed BlockFacts, data with no virtual function (no callback can hide in it)."""
    residency = (CSRC / "evict" / "residency.hpp").read_text()
    assert '#include "blocks/block_facts.hpp"' in residency
    assert re.search(r"const BlockFacts& facts_;", residency)
    assert not re.search(r"\bvirtual\b", _code((CSRC / "blocks" / "block_facts.hpp").read_text()))

