"""The ledger's reports: what a client tells the daemon of its pages, taken or refused whole.

Owns: admitting a report by its size before any work is done with it, and taking one into
its session's record (reports.py checks the values and sums them). Holds the books
(ledger_books.py).
Invariants: reports are untrusted: one from an observer or an ended session, with a value out
of range, or naming more page uses than its session holds pages (checked before any work is
done with it), is refused whole and, when it is malformed, counted as a protocol error; every
method takes the books' lock.
"""

from __future__ import annotations

from vtalloc.allocator.errors import InvalidArgumentError

from .ledger_books import LedgerBooks
from .protocol.errors import FailedPreconditionError, NotFoundError
from .records import Session
from .reports import ReportedUses, check_regions_count, check_report, check_uses_count, take_report
from .views import ClientReport

__all__ = ["LedgerReports"]


class LedgerReports:
    def __init__(self, books: LedgerBooks) -> None:
        self._books = books

    def admit(self, s: Session, uses: int, regions: int = 0) -> None:
        """Whether ``s`` may send a report naming ``uses`` page uses and ``regions`` regions:
        checked before anything is done with it (a client session, live, naming at most the
        pages it holds and MAX_REPORT_REGIONS regions: reports.py); a refusal counts as a
        protocol error."""
        b = self._books
        with b.lock:
            if s.kind != "client":
                raise FailedPreconditionError("an observer session has no pages to report")
            if not s.live:
                raise NotFoundError(f"session {s.session_id} has ended")
            try:
                check_uses_count(uses, len(s.pages), b.geometry.max_return_pages)
                check_regions_count(regions)
            except InvalidArgumentError:
                b.counters.protocol_errors_total += 1
                raise

    def record(self, s: Session, report: ClientReport, uses: ReportedUses | None = None) -> None:
        """Take a client's report (its page uses as received: ``uses``, else ``report.page_uses``);
        one with a value out of range, or naming more page uses than its session holds pages, is
        refused whole (reports.py) and counted as a protocol error."""
        b = self._books
        with b.lock:
            page_uses = report.page_uses if uses is None else uses
            self.admit(s, uses.received if uses is not None else len(page_uses))
            try:
                check_report(report)
            except InvalidArgumentError:
                b.counters.protocol_errors_total += 1
                raise
            take_report(s, report, b.clock(), b.counters, page_uses)
