"""Tables that fit the terminal: columns that do not fit move to further blocks of rows.

Owns: laying out a table of plain-text cells at a width. A table too wide for the terminal
is cut into blocks of columns, each repeating the key columns (what identifies a row: the
session id, the device) and titled "(continued)", rather than letting the terminal or rich
crop, squeeze or drop columns. ``width=None`` (``--wide``) keeps one block, as wide as it
needs.
Invariants: every column and every cell appears in the output (a cell longer than the width
folds onto more lines, never cut); with a width, no line printed from these tables is wider
than it; the key columns come first in every block; titles, headers and cells are plain text
(rich Text, never parsed as markup: a session name or path with "[...]" prints as it is); a
table with no rows is one block (its key columns and a caption saying it is empty), never a
run of empty "(continued)" blocks.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Optional, Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "fit", "natural_width"]

CONTINUED = " (continued)"
_MEASURE = Console(file=io.StringIO(), width=1 << 16, color_system=None)


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    key: bool = False   # identifies the row: repeated at the left of every block


def _table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], index: Sequence[int],
           caption: Optional[str] = None, min_width: Optional[int] = None) -> Table:
    t = Table(title=Text(title), title_justify="left", caption=Text(caption) if caption else None,
              caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0),
              min_width=min_width)
    for i in index:
        t.add_column(Text(columns[i].header), overflow="fold")
    for row in rows:
        t.add_row(*(Text(row[i]) for i in index))
    return t


def _pairs(title: str, columns: Sequence[Column], row: Sequence[str], width: int) -> Table:
    """One row as "name value" pairs, as many to a line as fit (a single-row table that is too wide)."""
    for per_line in range(len(columns), 0, -1):
        t = Table(title=Text(title), title_justify="left", box=None, show_header=False, pad_edge=False,
                  padding=(0, 1, 0, 0))
        for k in range(per_line):
            if k:
                t.add_column(width=1)  # between pairs: 3 spaces in all
            t.add_column(style="dim", overflow="fold")
            t.add_column(overflow="fold")
        for at in range(0, len(columns), per_line):
            cells: list[Text] = []
            for c, v in zip(columns[at:at + per_line], row[at:at + per_line]):
                cells += [Text(""), Text(c.header), Text(v)] if cells else [Text(c.header), Text(v)]
            t.add_row(*cells)
        if per_line == 1 or natural_width(t) <= width:
            return t
    raise AssertionError("unreachable")


def natural_width(table: Table) -> int:
    """The width ``table`` takes with no cell wrapped (its title aside)."""
    return Measurement.get(_MEASURE, _MEASURE.options, table).maximum


def fit(title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: Optional[int], *,
        short_title: Optional[str] = None, record: bool = False, caption: Optional[str] = None,
        empty: str = "(none)") -> list[Table]:
    """The table as blocks of columns, each at most ``width`` wide (one block when ``width`` is
    None). Blocks after the first are titled ``short_title`` (default: ``title``) + " (continued)".
    ``record``: a table of one row (a record, like the node's totals) that does not fit is shown
    as name/value pairs instead. ``caption`` goes under the first block; a table with no rows
    is one block of its key columns, captioned ``empty``."""
    keys = [i for i, c in enumerate(columns) if c.key]
    rest = [i for i, c in enumerate(columns) if not c.key]
    if not rows:
        whole = _table(title, columns, rows, keys + rest, caption=empty)
        return [whole if width is None or natural_width(whole) <= width else
                _table(title, columns, rows, keys or [0], caption=empty, min_width=min(width, len(title)))]
    whole = _table(title, columns, rows, keys + rest, caption=caption)
    if width is None or natural_width(whole) <= width:
        return [whole]
    if record and len(rows) == 1:
        return [_pairs(title, columns, rows[0], width)]
    blocks: list[list[int]] = []
    current = list(keys)
    for i in rest:
        trial = current + [i]
        if len(current) > len(keys) and natural_width(_table("", columns, rows, trial)) > width:
            blocks.append(current)
            current = keys + [i]
        else:
            current = trial
    blocks.append(current)
    note = f"more columns in the next {'table' if len(blocks) == 2 else f'{len(blocks) - 1} tables'}; " \
           "--wide: one line per row" + (f"\n{caption}" if caption else "")
    return [_table(title if n == 0 else (short_title or title) + CONTINUED, columns, rows, b,
                   caption=note if n == 0 else None) for n, b in enumerate(blocks)]
