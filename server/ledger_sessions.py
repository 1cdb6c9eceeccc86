"""The ledger's sessions: opening, authenticating, ending them, and who sees whom.

Owns: a session's life in the books (its id and secret token, its end and the pages it
leaves), the principal a session gets (the operator's map, or its pod), the admin rule, and
which sessions a caller may see and act on. Holds the books (ledger_books.py) and the
operator's principals and admins.
Invariants: a session sees, and acts on, only sessions of its own uid *and* principal (admins:
all); under ``--principal-by pod`` a session is admin only if its uid is and its cgroup is
exactly the daemon's own or under an ``--admin-cgroup`` (a pod's root is not the node's root);
an ended session holds no page and no open eviction ticket; every public method that reads or
writes the books takes their lock.
"""

from __future__ import annotations

import secrets
from typing import Iterable

from vtalloc.allocator.errors import InvalidArgumentError

from .ledger_books import LedgerBooks
from .principals import limit_key, under_cgroup
from .protocol.errors import NotFoundError, PermissionDeniedError, UnauthenticatedError, echo
from .quota import PrincipalMap, check_principal, pod_principal
from .records import SESSION_KINDS, Session

__all__ = ["LedgerSessions"]

_SESSION_ID_BYTES = 6                      # 48 random bits, shown in stats
_TOKEN_BYTES = 16                          # 128 random bits: the secret a call carries


class LedgerSessions:
    def __init__(self, books: LedgerBooks, *, principals: PrincipalMap = PrincipalMap(),
                 admin_uids: Iterable[int] = (0,), admin_cgroups: tuple[str, ...] | None = None) -> None:
        self._books = books
        self._principals = principals
        self._admin_uids = frozenset(admin_uids)
        self._admin_cgroups = admin_cgroups      # None: uid mode, admin by uid alone

    def open(self, pid: int, uid: int, gid: int, kind: str, start_ticks: int = 0, *, cgroup: str = "",
             pod: str | None = None, declared: tuple[int | None, int | None] | None = None) -> Session:
        """``pod``: the pod UID the kernel's cgroup path names (principals.py), which makes the
        principal ``pod:<uid>``; else the uid's. ``declared``: (min, max) from the hello, which can
        only lower the principal's quota (ignored for an observer)."""
        if kind not in SESSION_KINDS:
            raise InvalidArgumentError(f"session kind must be one of {', '.join(SESSION_KINDS)}, got {kind!r}")
        principal = pod_principal(pod) if pod else self._principals.principal_for(uid)
        b = self._books
        with b.lock:
            token = secrets.token_hex(_TOKEN_BYTES)
            sid = secrets.token_hex(_SESSION_ID_BYTES)
            while sid in b.sessions:  # a clash is unlikely, never allowed
                sid = secrets.token_hex(_SESSION_ID_BYTES)
            s = Session(sid, token, pid, uid, gid, check_principal(principal), kind, b.clock(),
                        start_ticks=start_ticks, cgroup=cgroup, pod=pod,
                        declared=declared if kind == "client" else None)
            b.sessions[sid] = s
            b.by_token[token] = s
            if kind == "client":
                b.counters.sessions_total += 1
            return s

    def authenticate(self, token: str | None) -> Session:
        with self._books.lock:
            s = self._books.by_token.get(token or "")
            if s is None or not s.live:
                raise UnauthenticatedError(
                    "no live session for this call: open one on the side channel and send its token "
                    "as x-vtalloc-session")
            return s

    def limit_keys(self) -> set[int | str]:
        """The limit keys (principals.limit_key: uid, or pod) of every caller with a live session."""
        with self._books.lock:
            return {limit_key(s.uid, s.pod) for s in self._books.sessions.values()}

    def is_admin(self, s: Session) -> bool:
        if s.uid not in self._admin_uids:
            return False
        if self._admin_cgroups is None:
            return True
        own, *more = self._admin_cgroups  # the daemon's own cgroup exactly (it may be "/"), then subtrees
        return bool(s.cgroup) and (s.cgroup == own or any(under_cgroup(s.cgroup, c) for c in more))

    def sees(self, caller: Session, s: Session) -> bool:
        """Whether ``caller`` may see and act on ``s``: an admin, or the same uid and principal."""
        return self.is_admin(caller) or (s.uid == caller.uid and s.principal == caller.principal)

    def require_admin(self, s: Session, what: str) -> None:
        if not self.is_admin(s):
            raise PermissionDeniedError(f"{what} needs an admin uid; uid {s.uid} is not one")

    def find(self, caller: Session, session_id: str) -> Session:
        """The session ``session_id`` if ``caller`` may see it (same uid, or an admin)."""
        with self._books.lock:
            s = self._books.sessions.get(session_id)
            if s is None or not s.live:
                raise NotFoundError(f"no session {echo(session_id)}")
            if not self.sees(caller, s):
                raise PermissionDeniedError(f"session {session_id} belongs to another uid or principal")
            return s

    def end(self, s: Session, *, clean: bool) -> list[int]:
        """Forget the session; returns the page ids it held, for the caller to release."""
        b = self._books
        with b.lock:
            if not s.live:
                return []
            s.live = False
            del b.sessions[s.session_id]
            del b.by_token[s.token]
            pages = list(s.pages)
            for p in pages:
                del b.owner[p]
            s.pages.clear()
            for t in b.tickets.values():
                if t.session_id == s.session_id:
                    t.open = False
            if s.kind == "client":
                if clean:
                    b.counters.pages_returned_total += len(pages)
                else:
                    b.counters.reclaims_total += 1
                    b.counters.reclaimed_pages_total += len(pages)
            return pages
