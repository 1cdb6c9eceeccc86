"""A space's Stats for people: the table ``AddressSpace.summary()`` prints.

Owns: :func:`space_summary`, a boxed table in the manner of ``torch.cuda.memory_summary()``
(memory by kind with its current value and peak, then the counts, the eviction engine and the
driver calls). ``str(Stats)``, the few grouped lines ``print(space.stats())`` shows, is the
Stats' own (allocator/stats.py).
Invariants: plain text (no terminal codes, no rich); every line at most 80 characters wide;
reads only the Stats it is given (the dataclass's repr stays the complete field list).
"""

from __future__ import annotations

from .config import format_size
from .stats import Stats

__all__ = ["space_summary"]

_WIDTH = 80
_LABEL = 36
_CELL = 19


def _row(label: str, *cells: str) -> str:
    body = f"| {label:<{_LABEL}}" + "".join(f"| {c:>{_CELL - 2}} " for c in cells)
    return body + " " * (_WIDTH - 1 - len(body)) + "|"


def _rule(char: str = "-") -> str:
    return "|" + char * (_WIDTH - 2) + "|"


def space_summary(s: Stats, title: str = "vtalloc address space") -> str:
    """The table (see the module's docstring); ``title`` names the space in its first line."""
    b = format_size
    title = title if len(title) <= _WIDTH - 4 else title[:_WIDTH - 7] + "..."
    lines = ["|" + "=" * (_WIDTH - 2) + "|", f"| {title:<{_WIDTH - 4}} |",
             f"| {f'capacity {b(s.capacity_bytes)} in pages of {b(s.page_bytes)}; eviction: {s.evict_mode}':<{_WIDTH - 4}} |",
             _rule("="), _row("memory", "current", "peak"), _rule()]
    for label, now, peak in (
            ("allocated (as requested)", s.allocated_bytes, s.peak_allocated_bytes),
            ("active (rounded to 512 B)", s.active_bytes, s.peak_active_bytes),
            ("mapped (pages under addresses)", s.mapped_bytes, s.peak_mapped_bytes),
            ("cached (mapped, no live data)", s.cached_bytes, None),
            ("pages held", s.pages_total * s.page_bytes, s.peak_pages_total * s.page_bytes),
            ("waiting for streams (freed)", s.pending_free_bytes, None),
            ("evicted to host", s.evicted_bytes, None),
            ("host pool used", s.host_pool_used_bytes, None)):
        lines.append(_row(label, b(now), "" if peak is None else b(peak)))
    lines += [_rule(), _row("counts", "", ""), _rule()]
    for label, value in (
            ("live allocations", f"{s.num_live_allocs}"),
            ("allocations / frees", f"{s.num_allocs} / {s.num_frees}"),
            ("pages mapped / held / free", f"{s.pages_mapped} / {s.pages_total} / {s.pages_free}"),
            ("fragmentation (mapped, unused)", f"{100 * s.fragmentation:.1f}%"),
            ("out-of-memory errors", f"{s.num_ooms}"),
            ("page reclaims / alloc retries", f"{s.num_page_reclaims} / {s.num_alloc_retries}"),
            ("evictions / restores (pages)", f"{s.evictions} / {s.restores}"),
            ("extent splits", f"{s.num_extent_splits}")):
        lines.append(_row(label, value, ""))
    lines += [_rule(), _row("driver calls", "", ""), _rule()]
    calls = [(k, v) for k, v in s.driver_calls().items() if v]
    for at in range(0, len(calls), 2):
        pair = calls[at:at + 2]
        lines.append(_row("  ".join(f"{k} {v}" for k, v in pair), "", ""))
    if not calls:
        lines.append(_row("none", "", ""))
    lines.append("|" + "=" * (_WIDTH - 2) + "|")
    return "\n".join(lines) + "\n"
