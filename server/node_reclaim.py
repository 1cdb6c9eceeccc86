"""The node's reclaim: what happens to pages no session holds any more.

Owns: letting go of pages a client may still reach (page_reclaim.py, Note [Memory a client
can still reach]): revoked then released, or retained in the books until that process exits
(the pidfds of the processes retaining pages, watched on the event loop), and releasing pages
to the page pool. Holds the page pool, the ledger's books (ledger_books.py) and the node's
changes (node_changes.py).
Invariants: a page is in the page pool exactly while the ledger has an owner for it (a
session, or a process retaining it); a page a client may still reach is revoked before it is
released, or retained until that process exits, except at an orderly stop; pages the ledger
lets go of are released at once (``release_pages``), never handed to another session, so no
bytes cross between sessions (memfd pages start zeroed; see docs/service.md on cuda pages);
every release wakes every waiter (``NodeChanges.changed``); nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import logging
import os

from vtalloc.allocator.page_pool import PagePool

from .ledger_books import LedgerBooks
from .node_changes import NodeChanges
from .page_reclaim import RETAIN, revoke_page
from .principals import pidfd_exited
from .records import Session

__all__ = ["NodeReclaim"]

log = logging.getLogger("vtalloc.server")


class NodeReclaim:
    def __init__(self, pool: PagePool, books: LedgerBooks, changes: NodeChanges) -> None:
        self._pool = pool
        self._books = books
        self._changes = changes
        self.policy = books.geometry.reclaim     # page_reclaim.py: REVOKE or RETAIN
        self._retainers: dict[int, int] = {}     # pid -> pidfd of a process retaining pages (RETAIN)

    def let_go(self, s: Session, pages: list[int], pidfd: int | None = None) -> None:
        """Pages no session of ``s``'s process holds any more, which it may still reach
        (page_reclaim.py, Note [Memory a client can still reach]): revoked then released, or
        retained until the process exits (``pidfd``: one to watch it by, duplicated here)."""
        if not pages:
            return
        if self.policy == RETAIN:
            self._books.retain(s, pages)
            self._watch_retainer(s, pidfd)
            self._changes.changed()
            return
        kept = []
        for p in pages:
            try:
                revoke_page(self._pool, p)
            except Exception:  # noqa: BLE001 - not revoked: counted until the process exits instead
                log.exception("could not revoke page %d of session %s; it stays counted until pid %d exits",
                              p, s.session_id, s.pid)
                kept.append(p)
        self.release_pages([p for p in pages if p not in kept])
        if kept:
            self._books.retain(s, kept)
            self._watch_retainer(s, pidfd)

    def _watch_retainer(self, s: Session, pidfd: int | None) -> None:
        """Watch the exit of ``s``'s process, whose retained pages are then released."""
        if s.pid in self._retainers:
            return
        loop = asyncio.get_running_loop()
        try:
            fd = os.dup(pidfd) if pidfd is not None else os.pidfd_open(s.pid)
        except OSError:  # gone already
            self._retainer_exited(s.pid)
            return
        if pidfd_exited(fd):
            os.close(fd)
            self._retainer_exited(s.pid)
            return
        self._retainers[s.pid] = fd
        loop.add_reader(fd, self._retainer_exited, s.pid)

    def _retainer_exited(self, pid: int) -> None:
        fd = self._retainers.pop(pid, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        pages = self._books.forget_retained(pid)
        if pages:
            log.info("pid %d exited: %d pages it retained back to the page pool", pid, len(pages))
        self.release_pages(pages)

    def release_pages(self, pages: list[int]) -> None:
        """Release ``pages`` to the page pool (their ids are never reused) and wake every waiter."""
        for p in pages:
            try:
                self._pool.release_page(p)
            except Exception:  # noqa: BLE001 - a page the page pool cannot release is logged, not fatal
                log.exception("could not release page %d", p)
        self._changes.changed()

    def close(self) -> None:
        """Stop watching retaining processes (at a stop: their pages go with the page pool)."""
        loop = asyncio.get_running_loop()
        for pid, fd in list(self._retainers.items()):
            loop.remove_reader(fd)
            os.close(fd)
            del self._retainers[pid]
