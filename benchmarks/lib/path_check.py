"""path_check: did a benchmark row measure the path its name says? (issue 26, "Benchmarks that tell the truth")

Owns: :func:`check` (one row's counters against what its path implies, as a JSON-able record),
:func:`failed` and :func:`require` (the rows that measured another path, and the loud failure
naming them), and :class:`PathNotTaken`.
Invariants: pure (no vtalloc, no torch); an expectation is exact (a number or a string the counter
must equal) unless it is written as a bound (``{"min": n}`` / ``{"max": n}``) or a choice
(``{"one_of": [...]}``), so a check is never
"at least 1" where the path fixes the count; a record says which counter missed, what it was and
what was expected, so the JSON shows what was measured instead; a benchmark writes its JSON
(checks included) before it exits non-zero.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

__all__ = ["PathNotTaken", "check", "failed", "require", "summary"]


class PathNotTaken(RuntimeError):
    """A benchmark row measured another path than the one it names."""


def _meets(want: Any, got: Any) -> bool:
    if isinstance(want, Mapping):
        if got is None:
            return False
        if "one_of" in want:
            return got in want["one_of"]
        return ("min" not in want or got >= want["min"]) and ("max" not in want or got <= want["max"])
    return bool(got == want)


def check(row: str, path: str, expected: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, Any]:
    """The record of one row's check: ``passed`` when every expected counter matches (exactly, within
    ``{"min": , "max": }``, or among ``{"one_of": []}``); ``mismatches`` names each one that did not and its value."""
    mismatches = [f"{k}={measured.get(k)!r} (expected {want!r})" for k, want in expected.items()
                  if not _meets(want, measured.get(k))]
    return {"row": row, "path": path, "passed": not mismatches, "expected": dict(expected),
            "measured": dict(measured), "mismatches": mismatches}


def failed(checks: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per failed check: the row, the path it names, what was measured instead."""
    return [f"{c['row']}: not the {c['path']} path: " + ", ".join(c["mismatches"]) for c in checks if not c["passed"]]


def summary(checks: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a record stores under ``path_checked``: every check, and whether all passed."""
    checks = list(checks)
    return {"passed": all(c["passed"] for c in checks), "rows_checked": len(checks), "failures": failed(checks),
            "checks": checks}


def require(checks: Iterable[Mapping[str, Any]], benchmark: str) -> None:
    """Raise :class:`PathNotTaken` naming every row that measured another path (none: return)."""
    bad = failed(checks)
    if bad:
        raise PathNotTaken(f"{benchmark}: {len(bad)} row(s) measured another path than they name:\n  "
                           + "\n  ".join(bad))
