"""One word, one meaning, in the allocator's names (docs/design.md, "Glossary").

Owns: a check over every identifier and module name of the allocator package (allocator/,
its torch glue included) against the words the glossary retires: "pool" alone (only "page
pool", "host pool" and torch's MemPool / graph-private pools are pools), "slab" (there are no
slabs: every allocation is a block), and "free handle" (a cached handle).
Invariants: a name is read from the token stream (identifiers only, not prose or strings), so
a comment may still say what a word used to mean (tests/test_glossary_retired.py reads the
prose); the few names kept for the C ABI or old imports are listed here with the reason, and
each must still exist (a stale exception fails). No module is named with a retired word: the
old ``vtalloc.allocator.pool`` is gone (its importers use ``page_pool``).
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOCATOR = ROOT / "allocator"

# Words a name may carry "pool" in, as the glossary defines them; and the C ABI's names, which
# stay (vta_pool_*: the page pool's functions, VtaPoolInfo their struct's ctypes mirror).
_POOL_OK = re.compile(r"page_?pool|host_?pool|mem_?pool|private_?pool|^vta_pool_|^VtaPoolInfo$", re.I)
# torch glue: PyTorch's pool ids (the glossary's graph-private pool) under torch's own names.
_TORCH_POOL_OK = re.compile(r"^(pool|pools|PoolId|VtaTorchPoolId|_?pool_[a-z_]+|[a-z_]+_pool|vta_torch_pool_[a-z_]+)$")
# Python names kept on purpose: the old name of the page pool's info, for old imports.
KEPT = {
    "allocator/page_pool.py": {"PoolInfo"},
    "allocator/__init__.py": {"PoolInfo"},
}


def identifiers(path: Path) -> set[str]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {t.string for t in tokens if t.type == tokenize.NAME}


def findings(path: Path, names: set[str]) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    glue = rel.startswith("allocator/torch/")
    kept = KEPT.get(rel, set())
    out = []
    for name in sorted(names - kept):
        low = name.lower()
        if "pool" in low and not _POOL_OK.search(name) and not (glue and _TORCH_POOL_OK.match(name)):
            out.append(f"{rel}: {name} (\"pool\" alone: page pool, host pool, or torch's MemPool)")
        if "slab" in low:
            out.append(f"{rel}: {name} (no slabs: every allocation is one block)")
        if "free_handle" in low or "freehandle" in low:
            out.append(f"{rel}: {name} (a mapped handle no block touches is a cached handle)")
    return out


def module_findings(modules: list[str]) -> list[str]:
    return [f"{m}: a module named with a retired word" for m in modules
            if re.search(r"(^|/)(pool|slab)[^/]*\.py$", m)]


def test_the_check_sees_retired_words():
    made_up = {"pool_size", "SlabCache", "free_handles", "page_pool", "host_pool_bytes", "mempool"}
    found = findings(ALLOCATOR / "made_up.py", made_up)
    assert [f.split(": ")[1].split(" ")[0] for f in found] == ["SlabCache", "free_handles", "pool_size"]
    modules = ["allocator/pool.py", "allocator/slabs.py", "allocator/page_pool.py", "allocator/torch/pools.py"]
    assert [f.split(":")[0] for f in module_findings(modules)] == ["allocator/pool.py", "allocator/slabs.py",
                                                                   "allocator/torch/pools.py"]


def test_allocator_names_use_the_glossary_words():
    files = sorted(ALLOCATOR.rglob("*.py"))
    assert files
    out = [f for p in files for f in findings(p, identifiers(p))]
    modules = [p.relative_to(ROOT).as_posix() for p in files]
    out += module_findings(modules)
    assert out == [], "\n".join(out)


def test_the_kept_names_still_exist():
    for rel, names in KEPT.items():
        assert names <= identifiers(ROOT / rel), rel  # an exception for a name gone is stale


def test_the_old_info_name_is_the_page_pools_and_the_old_module_is_gone():
    import importlib

    from vtalloc.allocator import PoolInfo, page_pool

    assert PoolInfo is page_pool.PoolInfo is page_pool.PagePoolInfo
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vtalloc.allocator.pool")
