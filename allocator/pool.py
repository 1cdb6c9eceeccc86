"""The old import path of the page pool: ``vtalloc.allocator.pool`` re-exports ``page_pool``.

Owns: nothing but the re-export, for code that imports ``vtalloc.allocator.pool`` (the daemon
does, until it moves to ``vtalloc.allocator.page_pool``). "Pool" alone is a retired word
(docs/design.md, "Glossary"): new code imports ``page_pool``.
Invariants: the names are page_pool's objects themselves (no copy, no wrapper).
"""

from __future__ import annotations

from .page_pool import PagePool, PagePoolInfo, PoolInfo

__all__ = ["PagePool", "PagePoolInfo", "PoolInfo"]
