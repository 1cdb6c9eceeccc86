"""One word per meaning for moving bytes to host and back, and for choosing what gives up memory.

Owns: the checks that hold docs/design.md's glossary decisions on these words:
- the engine *evicts* and *restores* pages; a user asks it per allocation to *offload* (evict
  now), *prefetch* (start restoring) or *ensure resident* (restore and wait); every public name
  of the C headers for these requests is named in the glossary, so a new one is a decision;
- the C ABI has one restore entry, ``vta_restore``: ``vta_prefetch`` and ``vta_ensure_resident``
  are documented aliases in ``vtalloc.h``, each one call of it in ``capi.cpp``, do what it does,
  and nothing in the tree calls them;
- one victim policy (the core's ``VictimPolicy``), and four other choices of what gives up
  memory with their own words (give-back order, pressure targets, evict-behind, make room), each
  used in the module that makes the choice; the Python above the core calls none of them a
  victim policy (it names the core's by its class, ``VictimPolicy``), and the client and the
  torch glue say "victim" nowhere (the daemon keeps ``LedgerVictims``, its pressure targets);
- the activation plan decides keep, page out or recompute, and the glossary names its values.
Invariants: each check reads the tree as it is (no list that can go stale without failing); the
plural "victim policies" / "victim choices" are retired in tests/test_glossary_retired.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from vtalloc.allocator import AddressSpace, _native
from vtalloc.allocator.errors import Status

from test_glossary import glossary_terms

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
HEADERS = [ROOT / "csrc" / "include" / "vtalloc" / "vtalloc.h", ROOT / "csrc" / "include" / "vtalloc" / "torch_shim.h"]
CAPI = ROOT / "csrc" / "capi" / "capi.cpp"
MiB = 1 << 20

# The restore entry and its aliases: alias -> the flags of the vta_restore call it is.
RESTORE_ENTRY = "vta_restore"
RESTORE_ALIASES = {"vta_prefetch": "0", "vta_ensure_resident": "VTA_RESTORE_WAIT"}
# The choices of what gives up memory: word -> what makes that choice (its file is found by it,
# so a module moved or split keeps the check).
CHOICES = {
    "victim policy": ("csrc", "class VictimPolicy"),
    "give-back order": ("client", "def evict_for_pressure"),
    "pressure targets": ("server", "class LedgerVictims"),
    "evict-behind": ("allocator", "def _evict_behind"),
    "make room": ("allocator", "def make_room"),
}


def glossary_rows(text: str) -> dict[str, str]:
    """Each glossary term -> its whole row."""
    section = text.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for row in section.splitlines():
        if row.startswith("|"):
            for term in glossary_terms("## Glossary\n| word | means |\n" + row + "\n"):
                rows[term] = row
    return rows


def c_entries(text: str) -> dict[str, str]:
    """Each VTA_API function of a header -> the comment right above its declaration."""
    out = {}
    for m in re.finditer(r"((?:/\*(?:[^*]|\*(?!/))*\*/\s*)?)VTA_API\s+[\w\s\*]+?\b(vta_\w+)\s*\(", text):
        out[m.group(2)] = re.sub(r"\s*\n\s*\*?\s*", " ", m.group(1))
    return out


def test_the_glossary_has_one_word_per_move_and_per_choice():
    terms = glossary_terms(DESIGN.read_text())
    for word in ("evict", "restore", "offload", "prefetch", "ensure resident", "keep", "page out", "recompute",
                 *CHOICES, "prefetch-ahead"):
        assert word in terms, f"docs/design.md's glossary does not define {word!r}"


def test_every_public_c_name_for_moving_bytes_is_in_the_glossary():
    """A public name of the headers that offloads, prefetches or restores is one the glossary names."""
    rows = glossary_rows(DESIGN.read_text())
    where = {"offload": rows["offload"], "prefetch": rows["prefetch"], "ensure_resident": rows["prefetch"],
             "restore": rows["prefetch"]}
    names = set()
    for header in HEADERS:
        text = header.read_text()
        names |= set(c_entries(text))
        names |= set(re.findall(r"\b(VTA_\w*(?:OFFLOAD|PREFETCH|ENSURE_RESIDENT)\w*)\b", text))
    missing = []
    for name in sorted(names):
        for stem, row in where.items():
            if stem in name.lower() and f"`{name}`" not in row:
                missing.append(f"{name}: not named in the glossary's row for {stem}")
    assert names >= {"vta_offload", "vta_restore", "vta_prefetch", "vta_torch_offload_bytes"}
    assert not missing, "\n".join(missing)


def test_every_public_python_name_for_moving_bytes_is_in_the_glossary():
    """offload / prefetch / ensure_resident stay the public words: each public call is one the glossary names."""
    import vtalloc.allocator.torch as vt_torch

    rows = glossary_rows(DESIGN.read_text())
    where = {"offload": rows["offload"], "prefetch": rows["prefetch"], "ensure_resident": rows["prefetch"]}
    public = [f"AddressSpace.{n}" for n in dir(AddressSpace) if not n.startswith("_")]
    public += [f"vtalloc.allocator.torch.{n}" for n in vt_torch.__all__]
    named = [p for p in public if any(stem in p for stem in where)]
    assert {"AddressSpace.offload", "AddressSpace.ensure_resident", "vtalloc.allocator.torch.prefetch"} <= set(named)
    missing = [p for p in named for stem, row in where.items()
               if stem in p.rsplit(".", 1)[1] and p.rsplit(".", 1)[1] not in row]
    assert not missing, f"public calls the glossary does not name: {missing}"


def test_the_c_abi_has_one_restore_entry_and_documented_aliases():
    entries = c_entries(HEADERS[0].read_text())
    restores = {n: c for n, c in entries.items() if re.search(r"prefetch|ensure_resident|restore", n)}
    primary = [n for n, c in restores.items() if not c.startswith("/* Alias of ")]
    assert primary == [RESTORE_ENTRY], f"restore entries that are not documented as aliases: {primary}"
    assert set(restores) - {RESTORE_ENTRY} == set(RESTORE_ALIASES)
    capi = CAPI.read_text()
    for alias, flags in RESTORE_ALIASES.items():
        call = f"vta_restore(space, address, stream, use_stream, {flags})"
        assert restores[alias].startswith(f"/* Alias of {call}"), (alias, restores[alias])
        body = re.search(rf"vta_status_t {alias}\([^)]*\) \{{\n(.*?)\n\}}", capi, re.S)
        assert body and body.group(1).strip() == f"return {call};", f"{alias} in capi.cpp is not one call of vta_restore"


def test_nothing_in_the_tree_calls_the_aliases():
    """The tree calls the restore entry; the aliases are for callers built against them."""
    kept = {"csrc/include/vtalloc/vtalloc.h", "csrc/capi/capi.cpp", "allocator/_native.py"}
    found = []
    for top in ("allocator", "client", "server", "csrc", "benchmarks", "tests", "scripts"):
        for p in (ROOT / top).rglob("*"):
            rel = p.relative_to(ROOT).as_posix()
            if p.suffix not in {".py", ".cpp", ".hpp", ".h", ".c"} or rel in kept or rel.startswith("tests/test_glossary"):
                continue
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if re.search(rf"\b({'|'.join(RESTORE_ALIASES)})\s*\(", line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "call vta_restore (its flags), not an alias:\n" + "\n".join(found)


def test_the_aliases_restore_as_the_entry_does():
    with AddressSpace(backend="host", capacity=8 * MiB, host_capacity=8 * MiB) as space:
        lib, h = space._lib, space._h()
        a = space.malloc(2 * MiB)
        space.write(a, b"\x5a" * 4096)
        space.set_evictable(a)
        space.offload(a)
        space.synchronize()
        assert space.residency(a) == "evicted"
        assert lib.vta_prefetch(h, a, 0, 0) == Status.OK  # starts the restore, as vta_restore(..., 0)
        space.synchronize()
        assert space.residency(a) == "resident"
        space.offload(a)
        space.synchronize()
        assert lib.vta_ensure_resident(h, a, 0, 0) == Status.OK  # waits, as vta_restore(..., WAIT)
        assert space.residency(a) == "resident" and space.read(a, 4096) == b"\x5a" * 4096
        for call in (lambda: lib.vta_prefetch(h, a + 1, 0, 0), lambda: lib.vta_ensure_resident(h, a + 1, 0, 0),
                     lambda: lib.vta_restore(h, a + 1, 0, 0, 0)):
            assert call() == Status.INVALID_ARGUMENT  # not an allocation: refused alike
        assert lib.vta_restore(h, a, 0, 0, _native.RESTORE_WAIT << 2) == Status.INVALID_ARGUMENT
        space.free(a)


def test_each_choice_of_what_gives_up_memory_has_its_own_word():
    rows = glossary_rows(DESIGN.read_text())
    for word, (top, definition) in CHOICES.items():
        name = definition.split()[1]
        homes = [p for p in (ROOT / top).rglob("*") if p.suffix in {".py", ".hpp", ".h"}
                 and definition in p.read_text(errors="replace")]
        assert len(homes) == 1, (definition, homes)
        assert name in rows[word], f"the glossary's {word!r} does not name {name}"
        assert word in homes[0].read_text().lower(), f"{homes[0]} ({name}) does not call its choice {word!r}"
    said = []
    for top in ("allocator", "client", "server"):
        for p in (ROOT / top).rglob("*.py"):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"victim[ _]polic", line, re.I):
                    said.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    for top in ("client", "allocator/torch"):
        for p in (ROOT / top).rglob("*.py"):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"victim", line, re.I):
                    said.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not said, "the victim policy is the core's; say give-back order, pressure targets, evict-behind or " \
        "make room:\n" + "\n".join(said)


def test_the_activation_plan_decisions_are_the_glossarys():
    from vtalloc.allocator import activation_plan as plan

    row = glossary_rows(DESIGN.read_text())["page out"]
    for name in ("KEEP", "PAGE", "RECOMPUTE", "SHARED"):
        assert f'`"{getattr(plan, name)}"`' in row and f"`{name}`" in row, name
    decisions = (ROOT / "docs" / "activation-plan.md").read_text().split("## How the plan is made")[0]
    assert "- **page out**" in decisions and "- **page**:" not in decisions
