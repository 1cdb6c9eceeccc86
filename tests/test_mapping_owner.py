"""Every reservation and mapping goes through one owner, the PageTable (csrc/vmm/page_table.*).

No part of csrc/ above the backends calls the backend's reserve, free_va, map, unmap or
set_access except the page table's own files, and the eviction engine (csrc/evict/) calls the
backend only for copies, streams, events, pinned host memory and what describes the backend:
its host slots' windows, host-located handles and mappings, its restore window and the host
copies it shows at an away page's address are the page table's (docs/design.md, "Layers",
"One owner of mappings"). Every Backend method is classified below, so a new one must be
decided on. Each check is first run on a made-up source that breaks it, so a checker that has
stopped seeing anything fails here rather than passing quietly.
"""

from __future__ import annotations

import re

from helpers.layers import ROOT

CSRC = ROOT / "csrc"
# What each Backend method does, as the rules below need it.
CATEGORIES: dict[str, set[str]] = {
    "mapping": {"reserve", "free_va", "map", "unmap", "set_access"},
    "handle": {"create_page", "release_page", "export_page", "import_page"},
    "copy": {"copy"},
    "stream": {"stream_create", "stream_destroy", "stream_synchronize", "stream_wait_event", "check_stream"},
    "event": {"event_create", "event_destroy", "event_record", "event_query", "event_synchronize"},
    "pinned": {"host_alloc_pinned", "host_free_pinned"},
    "describe": {"kind", "name", "device", "granularity", "default_capacity", "capabilities"},
    "device_wait": {"device_synchronize"},
    "test_kernels": {"launch_test_kernel", "test_kernel_counters"},
}
# The files that may make mapping calls: the page table and its rollback guard.
MAPPING_OWNER = ("vmm/page_table.cpp", "vmm/page_table_side.cpp", "vmm/mapping_rollback.hpp")
# What evict/ may ask the backend: copies, streams, events, pinned host memory (no mapping), and
# what the backend is (capabilities: whether mapped mode can run).
EVICT_MAY_CALL = set().union(*(CATEGORIES[c] for c in ("copy", "stream", "event", "pinned", "describe")))
# Rooms that hold the backends themselves (their implementations and adaptors): not scanned.
BACKEND_ROOMS = ("backend/",)

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_BACKEND_DECL = re.compile(r"\b\w*Backend\s*>?\s*(?:const\s*)?[&*]+\s*(\w+)|unique_ptr<\s*(?:vta::)?\w*Backend\s*>\s*(\w+)")


def backend_methods() -> set[str]:
    text = (CSRC / "backend" / "backend.hpp").read_text()
    body = text[text.index("class Backend {"):text.index("\n};", text.index("class Backend {"))]
    return set(re.findall(r"virtual\s+[^;(]*?(\w+)\s*\(", body)) - {"Backend"}


def backend_calls(text: str) -> list[tuple[int, str]]:
    """(line, method) for every call on a Backend in a C++ source: through `backend`, `backend_`
    or any name declared there as a Backend reference, pointer or unique_ptr. Comments ignored."""
    code = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    names = {"backend", "backend_"} | {a or b for a, b in _BACKEND_DECL.findall(code)}
    call = re.compile(r"(?:\b(?:%s)\s*(?:\.|->)|\(\s*\*\s*(?:%s)\s*\)\s*\.)\s*(\w+)\s*\(" % ("|".join(names), "|".join(names)))
    return [(code.count("\n", 0, m.start()) + 1, m.group(1)) for m in call.finditer(code)]


def findings(sources: dict[str, str]) -> list[str]:
    """sources: path under csrc/ -> text."""
    out = []
    for rel, text in sorted(sources.items()):
        if rel.startswith(BACKEND_ROOMS):
            continue
        for line, method in backend_calls(text):
            if method in CATEGORIES["mapping"] and rel not in MAPPING_OWNER:
                out.append(f"csrc/{rel}:{line}: backend {method}() outside the page table, the one owner of mappings")
            elif rel.startswith("evict/") and method not in EVICT_MAY_CALL:
                out.append(f"csrc/{rel}:{line}: evict/ calls backend {method}(); it may call only "
                           "copies, streams, events, pinned host memory and what describes the backend")
    return out


def csrc_sources() -> dict[str, str]:
    return {p.relative_to(CSRC).as_posix(): p.read_text()
            for p in sorted(CSRC.rglob("*")) if p.suffix in {".cpp", ".hpp", ".h"}}


def test_every_backend_method_is_classified():
    methods = backend_methods()
    assert {"map", "unmap", "copy", "host_alloc_pinned"} <= methods  # the reader sees the interface
    classified = set().union(*CATEGORIES.values())
    assert methods == classified, f"unclassified: {sorted(methods - classified)}; gone: {sorted(classified - methods)}"


def test_checker_sees_mapping_calls_outside_the_owner():
    made_up = {
        "evict/a.cpp": "void f(Backend& b) {\n  check(b.map(va, n, h));\n}\n",  # a Backend under another name
        "evict/b.cpp": "// backend_.unmap(va, n) in a comment\nvoid g() { check(backend_.copy(d, s, n, st)); }\n",
        "evict/c.cpp": "void h() {\n  (void)backend_->release_page(h);\n}\n",  # a handle: not evict/'s
        "evict/d.hpp": "Status e() { return backend_.event_synchronize(ev); }\n",
        "space/e.cpp": "void k() {\n\n  backend_->reserve(n, a, &va);\n}\n",
        "vmm/page_table.cpp": "void m() { backend_.set_access(va, n); }\n",
        "backend/host_backend.cpp": "void n() { backend_.map(va, n, h); }\n",
        "alloc/f.cpp": "void p() { (*backend).unmap(va, n); }\n",
    }
    assert findings(made_up) == [
        "csrc/alloc/f.cpp:1: backend unmap() outside the page table, the one owner of mappings",
        "csrc/evict/a.cpp:2: backend map() outside the page table, the one owner of mappings",
        "csrc/evict/c.cpp:2: evict/ calls backend release_page(); it may call only copies, streams, events, "
        "pinned host memory and what describes the backend",
        "csrc/space/e.cpp:3: backend reserve() outside the page table, the one owner of mappings",
    ]


def test_every_mapping_goes_through_the_page_table():
    sources = csrc_sources()
    owner_calls = {m for rel in MAPPING_OWNER for _, m in backend_calls(sources.get(rel, ""))}
    assert CATEGORIES["mapping"] <= owner_calls  # the reader sees the owner's own calls
    evict_calls = {m for rel, t in sources.items() if rel.startswith("evict/") for _, m in backend_calls(t)}
    assert {"copy", "host_alloc_pinned"} <= evict_calls  # ... and evict/'s
    found = findings(sources)
    assert not found, "\n".join(found)

