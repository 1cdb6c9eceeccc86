"""What every campaign shares: the outcome tally and the checks of a space's state.

Owns: ``Tally`` (tried / typed / other, per interface or operation) and ``space_consistent``.
Invariants: an outcome is "typed" only when it is one of the project's errors (or the
interface's documented refusal: a status code, a gRPC status with a message, a dropped
connection); anything else - a success where a refusal was due, an untyped exception, a hang -
is "other" and is kept with its description (the first few) so a nonzero count can be chased.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from vtalloc.allocator import global_counters
from vtalloc.allocator.errors import InternalError, VtallocError

KEEP = 20  # descriptions of "other" outcomes kept per tally

# Findings of these campaigns that are recorded as open in RELIABILITY.md: counted apart
# ("open"), listed in the JSON, and not failing the run. Remove an entry once it is fixed.
OPEN_FINDINGS: dict[str, re.Pattern[str]] = {}  # none open now (see RELIABILITY.md)


@dataclass
class Tally:
    tried: int = 0
    typed: int = 0
    other: int = 0
    others: list[str] = field(default_factory=list)
    open: dict[str, int] = field(default_factory=dict)  # outcomes of OPEN_FINDINGS, by name
    kinds: dict[str, int] = field(default_factory=dict)  # typed outcomes by error class

    def ok(self, kind: str) -> None:
        self.tried += 1
        self.typed += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def bad(self, what: str) -> None:
        for name, rx in OPEN_FINDINGS.items():
            if rx.search(what):
                self.open[name] = self.open.get(name, 0) + 1
                return  # a second check of the same attempt (after its retry) counts no new try
        self.tried += 1
        self.other += 1
        if len(self.others) < KEEP:
            self.others.append(what[:300])

    def expect_error(self, label: str, call: Callable[[], Any], typed: tuple[type, ...] = (VtallocError,)) -> None:
        """``call`` must raise one of ``typed``: counted typed; a return or another exception is not."""
        try:
            got = call()
        except InternalError as e:  # a broken invariant: a bug however typed
            self.bad(f"{label}: InternalError: {e}")
            return
        except typed as e:
            self.ok(type(e).__name__)
            return
        except BaseException as e:  # noqa: BLE001 - anything else is the finding
            if isinstance(e, KeyboardInterrupt):
                raise
            self.bad(f"{label}: untyped {type(e).__name__}: {e}")
            return
        self.bad(f"{label}: accepted (returned {got!r:.80})")

    def as_dict(self) -> dict[str, Any]:
        return {"tried": self.tried, "typed": self.typed, "other": self.other, "others": self.others,
                "typed_by_class": dict(sorted(self.kinds.items())),
                "known_open": dict(self.open)}


def show(value: Any, width: int = 40) -> str:
    """A short label for a generated input (a 5,000-digit int has no repr under CPython's limit)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<int of {value.bit_length()} bits>"
    return repr(value)[:width]


def merge(tallies: dict[str, Tally]) -> dict[str, Any]:
    out = {k: t.as_dict() for k, t in tallies.items()}
    out["total"] = {"tried": sum(t.tried for t in tallies.values()), "typed": sum(t.typed for t in tallies.values()),
                    "other": sum(t.other for t in tallies.values())}
    return out


def pattern(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def space_consistent(space: Any) -> str | None:
    """None when the space's books agree with its allocations; else what disagrees. Call it
    once the space is settled (after synchronize): an evicting page is both mapped and in flight."""
    st = space.stats()
    allocs = space.allocations()
    if st.num_live_allocs != len(allocs) or st.num_allocs - st.num_frees != len(allocs):
        return f"num_live_allocs {st.num_live_allocs}, allocs-frees {st.num_allocs - st.num_frees}, {len(allocs)} allocations"
    if st.allocated_bytes != sum(a.requested_bytes for a in allocs):
        return f"allocated_bytes {st.allocated_bytes} != sum of allocations"
    if st.pages_in_flight:
        return f"{st.pages_in_flight} pages still in flight (call after synchronize)"
    if st.pages_mapped + st.pages_free != st.pages_total:
        return f"pages mapped {st.pages_mapped} + free {st.pages_free} != total {st.pages_total}"
    return None


def leaks() -> dict[str, int]:
    """What the backends still hold process-wide (every counter must be 0 once all spaces closed)."""
    return {k: v for k, v in global_counters().items() if v}
