"""What a client reports about its pages: untrusted input, checked and summed without overflow.

Owns: the range of a report's values (:func:`check_report`: each count or byte total is
0 to MAX_REPORT_VALUE, protocol/rpc.py), the bound on its page uses (:func:`check_uses_count`:
at most the pages the session holds, checked before anything else is done with the report),
how the latest report becomes the session's (its rates, and the growth of its monotonic
counters added to the node's: :func:`take_report`), its page uses kept as received and read
only when a view asks (:class:`ReportedUses`), and saturating arithmetic for everything summed
over reports or sessions.
Invariants: every value the ledger stores from a report is within range; every node
counter fed by reports, and every sum over sessions, stays at most UINT64_MAX (the proto's
uint64: one larger value made every GetStats INTERNAL for everyone); a sum that would pass
it stops there (saturates) instead of wrapping or failing. No I/O and no lock: the ledger
(ledger.py) calls these under its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, Iterable, Iterator, Mapping

from vtalloc.allocator.checks import space_name
from vtalloc.allocator.errors import InvalidArgumentError

from .protocol.errors import echo
from .protocol.rpc import MAX_REPORT_REGIONS, MAX_REPORT_VALUE
from .records import NodeCounters, Session
from .views import PAGE_USES, ClientReport, PageUseReport, RegionReport

__all__ = ["UINT64_MAX", "ANY_SESSION_IDS", "check_report", "check_regions_count", "check_uses_count", "saturating_sum", "take_report", "ReportedUses"]

UINT64_MAX = (1 << 64) - 1
_LISTS = ("page_uses", "regions")
_VALUES = tuple(f.name for f in dataclasses.fields(ClientReport) if f.name not in _LISTS)
_REGION_VALUES = tuple(f.name for f in dataclasses.fields(RegionReport) if f.name != "tag")


def _check_value(what: str, value: object) -> None:
    if type(value) is not int or not 0 <= value <= MAX_REPORT_VALUE:
        raise InvalidArgumentError(
            f"report field {what} is {echo(value)}; a report value must be an integer from 0 to {MAX_REPORT_VALUE}")


def check_report(report: ClientReport) -> None:
    """InvalidArgumentError naming the first value out of 0..MAX_REPORT_VALUE, or a region list
    that is too long, names a tag twice or a tag off the rule (the report is refused whole)."""
    for name in _VALUES:
        _check_value(name, getattr(report, name))
    check_regions_count(len(report.regions))
    tags: set[str] = set()
    for r in report.regions:
        try:
            space_name(r.tag, "region tag")  # the allocator's rule for tags: a bounded label, safe to print
        except InvalidArgumentError:
            raise InvalidArgumentError(f"report region tag {echo(r.tag)}: a tag is 1 to 64 letters, digits and "
                                       ". _ - : / @ +, a letter or digit first") from None
        if r.tag in tags:
            raise InvalidArgumentError(f"a report lists region {r.tag!r} twice")
        tags.add(r.tag)
        for name in _REGION_VALUES:
            _check_value(f"regions.{name}", getattr(r, name))


def check_regions_count(count: int) -> None:
    """InvalidArgumentError when a report lists more than MAX_REPORT_REGIONS regions: checked
    before any of them is read."""
    if count > MAX_REPORT_REGIONS:
        raise InvalidArgumentError(f"a report lists {count} regions; at most {MAX_REPORT_REGIONS}")


# Page ids any request may name whatever its session holds: so few cost nothing, and an
# unknown or foreign id among them still gets its own code (NOT_FOUND, PERMISSION_DENIED).
ANY_SESSION_IDS = 64


def check_uses_count(count: int, held: int, limit: int, *, what: str | None = None) -> None:
    """InvalidArgumentError when a request (a report's page uses, a return's page ids) names
    more pages than its session holds (``held``, or ANY_SESSION_IDS if more) or than ``limit``
    (MAX_RETURN_PAGES): checked first, before any of them is read."""
    if count > min(max(held, ANY_SESSION_IDS), limit):
        raise InvalidArgumentError(
            f"{what or f'a report names {count} page uses'}; its session holds {held} pages (a request may name "
            f"at most as many, or {ANY_SESSION_IDS}, and never more than {limit})")


class ReportedUses(Sequence):
    """A report's page uses as received, decoded the first time a view reads them (then kept);
    uses of pages the session no longer holds then are dropped. Taking a report costs nothing
    per use, so a client cannot make the daemon's event loop pay for reports nobody reads."""

    __slots__ = ("_raw", "_decode", "_held", "_uses", "received")

    def __init__(self, raw: Sequence[Any], decode: Callable[[Any], PageUseReport], held: Mapping[int, Any]) -> None:
        self._raw, self._decode, self._held = raw, decode, held
        self._uses: tuple[PageUseReport, ...] | None = None
        self.received = len(raw)             # how many the client sent (no decoding)

    def _decoded(self) -> tuple[PageUseReport, ...]:
        if self._uses is None:
            uses = (self._decode(u) for u in self._raw)
            self._uses = tuple(u for u in uses if u.page_id in self._held and u.use in PAGE_USES)
            self._raw = ()
        return self._uses

    def __len__(self) -> int:
        return len(self._decoded())

    def __getitem__(self, i: Any) -> Any:
        return self._decoded()[i]

    def __iter__(self) -> Iterator[PageUseReport]:
        return iter(self._decoded())


def saturating_sum(values: Iterable[int]) -> int:
    """The sum, or UINT64_MAX if it would pass it."""
    return min(UINT64_MAX, sum(values))


def take_report(s: Session, report: ClientReport, now: float, counters: NodeCounters,
                uses: Sequence[PageUseReport]) -> None:
    """Make a checked ``report`` the session's latest: its rates since the last one, and the
    growth of its monotonic counters added to the node's (a decrease counts as a restart of
    the client's count: nothing is added; the node's counters saturate)."""
    prev, prev_at = s.report, s.report_at
    grew = {name: max(0, getattr(report, name) - (getattr(prev, name) if prev else 0))
            for name in ("evictions_total", "restores_total")}
    if prev is not None and now > prev_at:
        s.evictions_per_s = grew["evictions_total"] / (now - prev_at)
        s.restores_per_s = grew["restores_total"] / (now - prev_at)
    for name, n in grew.items():
        setattr(counters, name, saturating_sum((getattr(counters, name), n)))
    # Keep only what the session holds: a report cannot speak for another session's pages
    # (ReportedUses drops the others when a view first reads them).
    if not isinstance(uses, ReportedUses):
        uses = tuple(u for u in uses if u.page_id in s.pages and u.use in PAGE_USES)
    s.report, s.page_uses, s.report_at = dataclasses.replace(report, page_uses=()), uses, now
