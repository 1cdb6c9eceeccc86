"""Test-facing C++ stays in testing/ directories: production code includes none of it, and the
address space (the facade) declares no test hook (issue 41: composition, not hooks).

Each check is first shown a made-up case that breaks it, so a checker that has stopped seeing
anything fails here rather than passing quietly. The rules: docs/design.md, "Layers".
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers.layers import ROOT, Edge, csrc_edges, csrc_files, csrc_testing_findings, is_test_facing

ADDRESS_SPACE_HPP = ROOT / "csrc" / "space" / "address_space.hpp"
# What marks a test hook in a declaration (comments aside): the words of the hooks that left it.
HOOK_WORDS = re.compile(
    r"\b\w*(test|debug|inject|fault|kernel|user_stream|break_ordering|victim_counters|create_stream|"
    r"destroy_stream|synchronize_stream)\w*\b",
    re.I,
)
TEST_ENTRY_POINT = re.compile(r"^(vta_debug_\w+|vta_test_\w+|vta_backend_conformance)$")
_DEFINITION = re.compile(r'^\s*(?:extern\s+""\s+)?vta_status_t\s+(vta_\w+)\s*\(', re.M)  # strings emptied
_DECLARATION = re.compile(r"^VTA_API\s+\w+\s+(vta_\w+)\s*\(", re.M)


def _code(text: str) -> str:
    """C++ text without comments and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"//[^\n]*", " ", text)


def hook_declarations(header_text: str) -> list[str]:
    """The lines of a header's code that name a test hook."""
    return [line.strip() for line in _code(header_text).splitlines() if HOOK_WORDS.search(line)]


def test_checker_sees_production_includes_of_test_code():
    made_up = [
        Edge("space", "backend/testing", "csrc/space/address_space.hpp:28", "backend/testing/fault_injection.hpp"),
        Edge("capi", "backend/testing", "csrc/capi/backend_capi.cpp:12", "backend/testing/toy_backend.hpp"),
        Edge("vmm", "vmm", "csrc/vmm/testing/probe.cpp:3", "vmm/testing/probe.hpp"),  # testing to testing
        Edge("capi", "space/testing", "csrc/capi/testing/x.cpp:5", "space/testing/testing_space.hpp"),
        Edge("evict", "evict", "csrc/evict/x.cpp:7", "evict/testing/new_room.hpp"),  # a room no table ranks yet
        Edge("tests", "backend/testing", "csrc/tests/stress.cpp:9", "backend/testing/cost_model.hpp"),
        Edge("space", "space", "csrc/space/x.cpp:2", "space/address_space.hpp"),
    ]
    assert [f.split(":")[0] for f in csrc_testing_findings(made_up)] == [
        "csrc/space/address_space.hpp", "csrc/capi/backend_capi.cpp", "csrc/evict/x.cpp"]
    assert is_test_facing("csrc/space/testing/testing_space.cpp") and not is_test_facing("csrc/space/testing.cpp")


def test_production_code_includes_nothing_test_facing():
    edges = csrc_edges()
    assert any(e.include.startswith("backend/testing/") for e in edges)  # the reader sees testing includes
    findings = csrc_testing_findings(edges)
    assert not findings, "\n".join(findings)
    assert any(e.include.startswith("space/testing/") for e in edges)  # the test hooks' wrapper is included


def test_checker_sees_a_test_hook_in_a_header():
    made_up = """// Test hooks: see address_space_test_hooks.cpp
class AddressSpace {
 public:
  void free(uintptr_t address);  // a test hook named only in a comment is no hook
  void inject_fault(int op, int times, int skip = 0);
  StreamHandle create_stream();
  const char* name = "test";
};"""
    assert hook_declarations(made_up) == ["void inject_fault(int op, int times, int skip = 0);",
                                          "StreamHandle create_stream();"]


def test_address_space_declares_no_test_hook_and_inherits_nothing():
    text = ADDRESS_SPACE_HPP.read_text()
    found = hook_declarations(text)
    assert not found, "test hooks declared by AddressSpace (they belong to csrc/space/testing/):\n" + "\n".join(found)
    # A facade holding its parts as members: no base class.
    assert re.search(r"\bclass AddressSpace\s*\{", _code(text)), "AddressSpace inherits from something"


def _entry_points() -> dict[str, Path]:
    found = {}
    for path in csrc_files():
        if path.suffix == ".cpp":
            for m in _DEFINITION.finditer(_code(path.read_text())):
                found[m.group(1)] = path
    return found


def test_test_entry_points_live_in_capi_testing():
    """The C ABI's test-only functions (vta_debug_*, vta_test_*, the conformance report), as the
    public header declares them (callers unchanged), are each defined under capi/testing/."""
    header = (ROOT / "csrc" / "include" / "vtalloc" / "vtalloc.h").read_text()
    tests_only = [name for name in _DECLARATION.findall(header) if TEST_ENTRY_POINT.match(name)]
    assert len(tests_only) >= 12 and "vta_backend_conformance" in tests_only, tests_only
    defined = _entry_points()
    misplaced = [f"{name}: {defined[name].relative_to(ROOT) if name in defined else 'not defined'}"
                 for name in tests_only if defined.get(name, ROOT).parent != ROOT / "csrc" / "capi" / "testing"]
    assert not misplaced, "\n".join(misplaced)


def test_only_test_facing_code_reaches_a_spaces_parts():
    """AddressSpace::with_parts (the seam its extension composes through) is called only from
    files under a testing/ directory."""
    callers = [path.relative_to(ROOT).as_posix() for path in csrc_files()
               if path != ADDRESS_SPACE_HPP and "with_parts(" in _code(path.read_text())]
    assert callers and all(is_test_facing(c) for c in callers), callers
