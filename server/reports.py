"""What a client reports about its pages: untrusted input, checked and summed without overflow.

Owns: the range of a report's values (:func:`check_report`: each count or byte total is
0 to MAX_REPORT_VALUE, protocol/rpc.py), how the latest report becomes the session's (its
rates, and the growth of its monotonic counters added to the node's: :func:`take_report`),
and saturating arithmetic for everything summed over reports or sessions.
Invariants: every value the ledger stores from a report is within range; every node
counter fed by reports, and every sum over sessions, stays at most UINT64_MAX (the proto's
uint64: one larger value made every GetStats INTERNAL for everyone); a sum that would pass
it stops there (saturates) instead of wrapping or failing. No I/O and no lock: the ledger
(ledger.py) calls these under its own.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from vtalloc.allocator.checks import space_name
from vtalloc.allocator.errors import InvalidArgumentError

from .protocol.errors import echo
from .protocol.rpc import MAX_REPORT_REGIONS, MAX_REPORT_VALUE
from .records import NodeCounters, Session
from .views import PAGE_USES, ClientReport, RegionReport

__all__ = ["UINT64_MAX", "check_report", "saturating_sum", "take_report"]

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
    if len(report.regions) > MAX_REPORT_REGIONS:
        raise InvalidArgumentError(f"a report lists {len(report.regions)} regions; at most {MAX_REPORT_REGIONS}")
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


def saturating_sum(values: Iterable[int]) -> int:
    """The sum, or UINT64_MAX if it would pass it."""
    return min(UINT64_MAX, sum(values))


def take_report(s: Session, report: ClientReport, now: float, counters: NodeCounters) -> None:
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
    # Keep only what the session holds: a report cannot speak for another session's pages.
    uses = tuple(u for u in report.page_uses if u.page_id in s.pages and u.use in PAGE_USES)
    s.report, s.report_at = dataclasses.replace(report, page_uses=uses), now
