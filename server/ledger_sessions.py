"""The ledger's sessions: opening, authenticating, ending them, and who sees whom.

Owns: a session's life in the books (its id and secret token, its end and the pages it
leaves), the admin rule, which sessions a caller may see and act on, and the client reports a
session sends (reports.py checks them).
Invariants: a session sees, and acts on, only sessions of its own uid *and* principal (admins:
all); under ``--principal-by pod`` a session is admin only if its uid is and its cgroup is
exactly the daemon's own or under an ``--admin-cgroup`` (a pod's root is not the node's root);
an ended session holds no page and no open eviction ticket; reports are untrusted: one with a
value out of range, or naming more page uses than its session holds pages (checked before any
work is done with it), is refused whole and counted as a protocol error.
"""

from __future__ import annotations

import secrets

from vtalloc.allocator.errors import InvalidArgumentError

from .ledger_books import LedgerBooks
from .principals import limit_key, under_cgroup
from .protocol.errors import (
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    echo,
)
from .quota import check_principal, pod_principal
from .records import SESSION_KINDS, Session
from .reports import ReportedUses, check_regions_count, check_report, check_uses_count, take_report
from .views import ClientReport

__all__ = ["LedgerSessions"]

_SESSION_ID_BYTES = 6                      # 48 random bits, shown in stats
_TOKEN_BYTES = 16                          # 128 random bits: the secret a call carries


class LedgerSessions(LedgerBooks):
    def open_session(self, pid: int, uid: int, gid: int, kind: str, start_ticks: int = 0, *, cgroup: str = "",
                     pod: str | None = None, declared: tuple[int | None, int | None] | None = None) -> Session:
        """``pod``: the pod UID the kernel's cgroup path names (principals.py), which makes the
        principal ``pod:<uid>``; else the uid's. ``declared``: (min, max) from the hello, which can
        only lower the principal's quota (ignored for an observer)."""
        if kind not in SESSION_KINDS:
            raise InvalidArgumentError(f"session kind must be one of {', '.join(SESSION_KINDS)}, got {kind!r}")
        principal = pod_principal(pod) if pod else self._principals.principal_for(uid)
        with self._lock:
            token = secrets.token_hex(_TOKEN_BYTES)
            sid = secrets.token_hex(_SESSION_ID_BYTES)
            while sid in self._sessions:  # a clash is unlikely, never allowed
                sid = secrets.token_hex(_SESSION_ID_BYTES)
            s = Session(sid, token, pid, uid, gid, check_principal(principal), kind, self._clock(),
                        start_ticks=start_ticks, cgroup=cgroup, pod=pod,
                        declared=declared if kind == "client" else None)
            self._sessions[sid] = s
            self._by_token[token] = s
            if kind == "client":
                self._counters.sessions_total += 1
            return s

    def authenticate(self, token: str | None) -> Session:
        with self._lock:
            s = self._by_token.get(token or "")
            if s is None or not s.live:
                raise UnauthenticatedError(
                    "no live session for this call: open one on the side channel and send its token "
                    "as x-vtalloc-session")
            return s

    def session_keys(self) -> set[int | str]:
        """The limit keys (principals.limit_key: uid, or pod) of every caller with a live session."""
        with self._lock:
            return {limit_key(s.uid, s.pod) for s in self._sessions.values()}

    def is_admin(self, s: Session) -> bool:
        if s.uid not in self._admin_uids:
            return False
        if self._admin_cgroups is None:
            return True
        own, *more = self._admin_cgroups  # the daemon's own cgroup exactly (it may be "/"), then subtrees
        return bool(s.cgroup) and (s.cgroup == own or any(under_cgroup(s.cgroup, c) for c in more))

    def _sees(self, caller: Session, s: Session) -> bool:
        """Whether ``caller`` may see and act on ``s``: an admin, or the same uid and principal."""
        return self.is_admin(caller) or (s.uid == caller.uid and s.principal == caller.principal)

    def require_admin(self, s: Session, what: str) -> None:
        if not self.is_admin(s):
            raise PermissionDeniedError(f"{what} needs an admin uid; uid {s.uid} is not one")

    def session_for(self, caller: Session, session_id: str) -> Session:
        """The session ``session_id`` if ``caller`` may see it (same uid, or an admin)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or not s.live:
                raise NotFoundError(f"no session {echo(session_id)}")
            if not self._sees(caller, s):
                raise PermissionDeniedError(f"session {session_id} belongs to another uid or principal")
            return s

    def end_session(self, s: Session, *, clean: bool) -> list[int]:
        """Forget the session; returns the page ids it held, for the caller to release."""
        with self._lock:
            if not s.live:
                return []
            s.live = False
            del self._sessions[s.session_id]
            del self._by_token[s.token]
            pages = list(s.pages)
            for p in pages:
                del self._owner[p]
            s.pages.clear()
            for t in self._tickets.values():
                if t.session_id == s.session_id:
                    t.open = False
            if s.kind == "client":
                if clean:
                    self._counters.pages_returned_total += len(pages)
                else:
                    self._counters.reclaims_total += 1
                    self._counters.reclaimed_pages_total += len(pages)
            return pages


    # -- reports ----------------------------------------------------------------------------
    def admit_report(self, s: Session, uses: int, regions: int = 0) -> None:
        """Whether ``s`` may send a report naming ``uses`` page uses and ``regions`` regions:
        checked before anything is done with it (a client session, live, naming at most the
        pages it holds and MAX_REPORT_REGIONS regions: reports.py); a refusal counts as a
        protocol error."""
        with self._lock:
            if s.kind != "client":
                raise FailedPreconditionError("an observer session has no pages to report")
            if not s.live:
                raise NotFoundError(f"session {s.session_id} has ended")
            try:
                check_uses_count(uses, len(s.pages), self.geometry.max_return_pages)
                check_regions_count(regions)
            except InvalidArgumentError:
                self._counters.protocol_errors_total += 1
                raise

    def record_report(self, s: Session, report: ClientReport, uses: ReportedUses | None = None) -> None:
        """Take a client's report (its page uses as received: ``uses``, else ``report.page_uses``);
        one with a value out of range, or naming more page uses than its session holds pages, is
        refused whole (reports.py) and counted as a protocol error."""
        with self._lock:
            page_uses = report.page_uses if uses is None else uses
            self.admit_report(s, uses.received if uses is not None else len(page_uses))
            try:
                check_report(report)
            except InvalidArgumentError:
                self._counters.protocol_errors_total += 1
                raise
            take_report(s, report, self._clock(), self._counters, page_uses)
