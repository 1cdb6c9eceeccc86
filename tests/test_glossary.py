"""One word, one meaning: the glossary of docs/design.md, and the words the daemon and the CLI use.

Owns: the checks that the glossary names each term once, and that the Python of server/ and
client/ (the generated stubs aside) says "give back" for pages going back to the daemon and
nothing else: the retired verbs (``take_back``, a bare ``_release``, ``return_pages`` as a
name of its own) are not used as names, and a function named ``give_back`` lives only where
pages go back.
Invariants: what is kept is listed here with its reason (the wire's ``Return`` RPC and its
limit ``MAX_RETURN_PAGES``; the core's public ``AddressSpace.return_pages``, called, never
defined, above the allocator), so reintroducing a retired word fails with the place named.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"

# Names a retired verb may not appear in, as a whole name or a word of one (snake or camel case).
RETIRED = {
    "take_back": "pages a session gives back are given back (give_back), not taken back",
    "_release": "a node page is released to the page pool by name (_release_pages, PagePool.release_page)",
}
# Kept, with why: the wire's names (a rename would break every client and daemon of another
# version) and the allocator core's public API (AddressSpace.return_pages, which picks the pages
# to give back; not this layer's to rename).
KEPT_WIRE_NAMES = {"Return", "ReturnRequest", "ReturnReply", "MAX_RETURN_PAGES", "max_return_pages"}
# The only modules where a function called give_back may be defined: pages going back to the daemon.
GIVE_BACK_HOMES = {
    "server/ledger_leases.py",   # the ledger checks and records the pages a session gives back
    "server/node_leases.py",     # the node's answer to the Return RPC
    "client/lease.py",           # the lease as a page source: pages go back to the daemon
    "client/service_space.py",   # ServiceAddressSpace.give_back, the public call
    "client/lease_threads.py",   # the evict handler's give_back(n)
}


def _sources() -> list[Path]:
    return sorted(p for d in ("server", "client") for p in (ROOT / d).rglob("*.py") if "proto" not in p.parts)


def _defined_names(tree: ast.AST) -> list[tuple[str, int]]:
    """Every name the code gives something: functions, classes, parameters, variables, attributes set."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.name, node.lineno))
        elif isinstance(node, ast.arg):
            out.append((node.arg, node.lineno))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.append((node.attr, node.lineno))
    return out


def _used_names(tree: ast.AST) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute):
            out.append((node.attr, node.lineno))
    return out


def retired_name_findings(path: Path, text: str) -> list[str]:
    tree = ast.parse(text, str(path))
    rel = path.relative_to(ROOT).as_posix()
    defined = set(_defined_names(tree))
    found = []
    for name, line in sorted(defined | set(_used_names(tree)), key=lambda x: (x[1], x[0])):
        low = name.lower()
        if name == "_release" or "take_back" in low or "takeback" in low:
            why = RETIRED["_release" if name == "_release" else "take_back"]
            found.append(f"{rel}:{line}: {name}: {why}")
        if (name, line) not in defined or name in KEPT_WIRE_NAMES:
            continue
        if "return_pages" in low:
            found.append(f"{rel}:{line}: {name}: pages go back to the daemon by give_back; return_pages is "
                         "the allocator core's public call, not a name to define here")
        if name.startswith("Return") and not (rel == "server/service.py" and name == "Return"):
            found.append(f"{rel}:{line}: {name}: Return is the wire's RPC only")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "give_back" \
                and rel not in GIVE_BACK_HOMES:
            found.append(f"{rel}:{node.lineno}: give_back means pages going back to the daemon; "
                         "this module is not one of its homes (GIVE_BACK_HOMES): use another verb, or add it there")
    for m in re.finditer(r"\b(take[ns]?|took|taking)[ _]back\b", text, re.I):
        found.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: '{m.group(0)}': say give back")
    return found


def glossary_terms(text: str) -> list[str]:
    """The terms of the glossary table (its first column, split at commas), in order."""
    section = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    terms = []
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if not row.startswith("|") or cells[0] in ("word", "") or set(cells[0]) <= set("-"):
            continue
        terms += [t.strip() for t in re.sub(r"\(.*?\)", "", cells[0]).split(",") if t.strip()]
    return terms


def test_the_glossary_lists_each_term_once():
    terms = glossary_terms(DESIGN.read_text())
    assert "give back" in terms and "release" in terms and "page pool" in terms
    twice = sorted({t for t in terms if terms.count(t) > 1})
    assert not twice, f"docs/design.md's glossary lists these terms more than once: {twice}"


def test_the_glossary_check_catches_a_term_listed_twice():
    text = DESIGN.read_text().replace("| lease, leased page |", "| lease, leased page, page pool |", 1)
    terms = glossary_terms(text)
    assert terms.count("page pool") == 2


def test_server_and_client_use_no_retired_verb_for_pages_going_back():
    findings = [f for p in _sources() for f in retired_name_findings(p, p.read_text())]
    assert not findings, "\n".join(findings)


def test_every_kept_name_is_still_there():
    """The list of kept names is not stale: each is still used (else it is retired, and comes off)."""
    text = "\n".join(p.read_text() for p in _sources())
    for name in KEPT_WIRE_NAMES | {"return_pages"}:
        assert re.search(rf"\b{name}\b", text), name
    for home in GIVE_BACK_HOMES:
        assert "def give_back" in (ROOT / home).read_text(), home


def test_reintroducing_a_retired_word_fails(tmp_path):
    path = ROOT / "server" / "example.py"
    cases = {
        "def take_back(self, s, page_ids):\n    pass\n": "take_back",
        "class X:\n    def _release(self, pages):\n        pass\n": "_release",
        "def f(space):\n    return_pages = space.stats()\n": "return_pages",
        "def f(slots):\n    slots.give_back(1)\ndef give_back(uid):\n    pass\n": "give_back means",
        '"""The daemon takes back the pages."""\n': "takes back",
        "def ReturnAll():\n    pass\n": "wire's RPC only",
    }
    for code, expect in cases.items():
        found = retired_name_findings(path, code)
        assert any(expect in f for f in found), (code, found)
    # What is kept is not a finding: the wire's RPC in the servicer, the core's call, its limit.
    assert not retired_name_findings(ROOT / "server" / "service.py", "class S:\n    async def Return(self):\n"
                                     "        return MAX_RETURN_PAGES\n")
    assert not retired_name_findings(ROOT / "client" / "lease.py", "def g(space):\n    space.return_pages(1)\n")
