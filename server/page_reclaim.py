"""What the node does with a page its client may still reach: revoke it, or count it until that
process exits (Note [Memory a client can still reach]).

Owns: the policy per backend, stated as data (:data:`RECLAIM`: ``"revoke"`` or ``"retain"``;
NodeGeometry.reclaim carries the node's) and the revocation of a host page
(:func:`revoke_page`).
Invariants: the node's books never call a page free while a client can still reach its memory:
a page is released to the page pool only once its memory is unreachable (revoked), or its
process has exited; a revoked page has no bytes left (its memfd is truncated to 0), whoever
kept a descriptor or a mapping of it.

Note [Memory a client can still reach]
--------------------------------------
A lease sends each page's descriptor to the client (SCM_RIGHTS); a descriptor cannot be taken
back, and a client may keep it (or its mapping, or a copy sent to another process) after it
gives the page back or its session ends. The daemon used to release such a page and count it
free: a uid with a 32 MiB maximum held 512 MiB, written and readable, while the books said
0 leased and every page free, and another user then leased the node again. So:

- host pages (memfds) are **revoked**: before a page given back, or left by an ended session,
  is released, the daemon truncates its memfd to 0 bytes through a descriptor of its own. The
  kernel frees the memory and removes it from every mapping in every process at once: a
  client that kept a descriptor finds an empty file, one that kept a mapping gets SIGBUS on
  its next access (as after any truncation of a shared file). The memfd is made without
  MFD_ALLOW_SEALING, so it carries F_SEAL_SEAL and nobody can seal it against shrinking. Only
  an orderly stop revokes nothing: the clients keep what they mapped (docs/service.md, Crashes
  and restarts).
- cuda pages cannot be revoked (the driver keeps an exported allocation alive while any
  process holds a handle to it), so they are **retained**: a page given back, or left by an
  ended session, keeps counting against its principal and the node as held by the process it
  was leased to, until that process exits (the daemon keeps its pidfd), and a later lease by
  that process gets its retained pages again first (re-exported; no new memory). A client
  that answers an eviction request on cuda frees node capacity only when it exits. A page whose
  descriptor the process passed on to another process that outlives it is not counted after
  the first process exits (not covered: the driver gives no way to see it).
"""

from __future__ import annotations

import os

from vtalloc.allocator.page_pool import PagePool

__all__ = ["RECLAIM", "REVOKE", "RETAIN", "reclaim_of", "revoke_page"]

REVOKE, RETAIN = "revoke", "retain"
RECLAIM = {"host": REVOKE, "cuda": RETAIN}


def reclaim_of(backend: str) -> str:
    """The policy of ``backend``'s pages; a backend not listed is retained (the safe side)."""
    return RECLAIM.get(backend, RETAIN)


def revoke_page(pool: PagePool, page_id: int) -> None:
    """Take a host page's memory back from whoever holds it: truncate its memfd to 0 bytes
    (through a descriptor of the daemon's own, closed at once)."""
    fd = pool.export_page(page_id)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)
