"""``vtalloc plot``: the page map as a picture (PNG, SVG or PDF), from a ``vtalloc.pages/v1`` document.

Owns the drawing only. Invariants: the colour of a cell says its state and nothing else, and
the legend's swatch for a state is drawn with exactly the face colour and hatch of that
state's cells (one table, STATES, feeds both); the legend lists only the states drawn. Cells
are grouped in bands, each starting on its own row under a label on the left: one band per
session (its pages in page-id order), then other users' pages, pages held by a previous
daemon's clients, and free slots. Each cell is one page, or ``k`` pages when the node has
more than MAX_CELLS (then the cell shows its pages' most common state). A page's state is
its ``use`` as its session last reported it; pages leased since that report are "not yet
reported"; a session whose report covers no page by id is drawn from its counts, its ids
beside it. Page ids are written in the cells when each cell is one page and they fit
(LABELLED_CELLS), else each session's label lists its id ranges. Evicted pages (data held
in host memory, not on the node) have no cell: a note after their session's band counts
them, and the title gives the total or says that nothing is evicted (no empty panel).
matplotlib is imported here only (extra ``plot``), without pyplot, so drawing never changes
the caller's matplotlib backend.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any, NamedTuple

from vtalloc.allocator.errors import InvalidArgumentError, VtallocError

__all__ = ["plot_page_map", "page_map_figure", "output_format", "STATES", "FORMATS", "MAX_CELLS", "LABELLED_CELLS"]

MAX_CELLS = 4096       # more pages than this: one cell stands for several
LABELLED_CELLS = 384   # up to this many one-page cells, each shows its page id
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}


class State(NamedTuple):
    label: str
    face: str        # fill, "#rrggbb"
    hatch: str       # "" for none; drawn in the edge colour
    edge: str


# Okabe-Ito colours (distinct under the common colour-vision deficiencies); the two greys
# carry hatching, so "other users" and "previous daemon" read apart from each other and from
# free slots in print too. Order: the legend's.
STATES: dict[str, State] = {
    "resident": State("resident (live data)", "#0072B2", "", "white"),
    "cached": State("cached (mapped, no live data)", "#56B4E9", "", "white"),
    "unmapped": State("unmapped (held, not mapped)", "#F0E442", "", "white"),
    "in_flight": State("in flight (being evicted or restored)", "#D55E00", "", "white"),
    "leased": State("leased, not yet reported", "#CC79A7", "", "white"),
    "delivering": State("delivering (being handed over)", "#009E73", "", "white"),
    "hidden": State("other users' pages", "#4D4D4D", "////", "white"),
    "inherited": State("held by a previous daemon's clients", "#1A1A1A", "xxx", "#B0B0B0"),
    "free": State("free", "#E4E4E4", "", "white"),
}


class _Cell(NamedTuple):
    state: str
    page_id: int | None


class _Band(NamedTuple):
    label: str
    cells: list[_Cell]
    session_id: str | None
    ids: str  # the band's page ids as ranges ("" when it has none)


def output_format(out: str) -> str:
    """The format ``out`` names by its extension (``png``, ``svg``, ``pdf``); else InvalidArgumentError."""
    ext = os.path.splitext(str(out))[1].lower()
    if ext not in FORMATS:
        raise InvalidArgumentError(f"{out!r}: the picture's format follows the file's extension; use one of "
                                   f"{', '.join(FORMATS)} (got {ext or 'none'})")
    return FORMATS[ext]


def _session_cells(s: dict[str, Any], mine: list[dict[str, Any]]) -> list[_Cell]:
    mine = sorted(mine, key=lambda p: p["page_id"])
    held = [p for p in mine if p["state"] != "delivering"]
    delivering = [_Cell("delivering", p["page_id"]) for p in mine if p["state"] == "delivering"]
    if held and s["reported"] and all(p.get("use", "unknown") == "unknown" for p in held):
        # The report speaks in counts only: draw them, without claiming which page is which.
        cells: list[_Cell] = []
        for state, n in (("resident", s["resident_pages"]), ("cached", s["cached_pages"]),
                         ("unmapped", s["unmapped_pages"])):
            cells += [_Cell(state, None)] * min(n, len(held) - len(cells))
        return cells + [_Cell("leased", None)] * (len(held) - len(cells)) + delivering
    known = {"resident", "cached", "unmapped", "in_flight"}
    return [_Cell(p["use"] if p.get("use") in known else "leased", p["page_id"]) for p in held] + delivering


def _bands(doc: dict[str, Any]) -> list[_Band]:
    d = doc["devices"][0]
    bands = []
    for s in doc["sessions"]:
        mine = [p for p in doc["pages"] if p["session_id"] == s["session_id"]]
        label = f"session {s['session_id']}\n{s['principal']}, pid {s['pid']}"
        bands.append(_Band(label, _session_cells(s, mine), s["session_id"],
                           _id_ranges(sorted(p["page_id"] for p in mine)) if mine else ""))
    for key, n, label in (("hidden", doc.get("hidden_pages", 0), "other users"),
                          ("inherited", d.get("inherited_pages", 0), "previous daemon"),
                          ("free", d["free_pages"], "free")):
        if n:
            bands.append(_Band(label, [_Cell(key, None)] * n, None, ""))
    return bands


def _group(cells: list[_Cell], k: int) -> list[_Cell]:
    """Every ``k`` cells as one: their most common state, their first page id."""
    if k == 1:
        return cells
    out = []
    for i in range(0, len(cells), k):
        chunk = cells[i:i + k]
        out.append(_Cell(Counter(c.state for c in chunk).most_common(1)[0][0], chunk[0].page_id))
    return out


def _id_ranges(ids: list[int], most: int = 3) -> str:
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most])
    return "ids " + text + (f", ... ({len(runs) - most} more runs)" if len(runs) > most else "")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n < 1 << 30 else f"{n / (1 << 30):.3g} GiB"


def _dark(hex_colour: str) -> bool:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45


def plot_page_map(doc: dict[str, Any], out: str, *, title: str | None = None) -> dict[str, Any]:
    """Draw ``doc`` (a vtalloc.pages/v1 document) to ``out`` (.png, .svg or .pdf); returns what was drawn."""
    fmt = output_format(out)
    fig, drawn = page_map_figure(doc, title=title)
    fig.savefig(out, format=fmt, dpi=120, bbox_inches="tight", pad_inches=0.15)
    return {**drawn, "format": fmt}


def page_map_figure(doc: dict[str, Any], *, title: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The matplotlib Figure of ``doc``, and what it shows. Its first axes hold one
    PatchCollection per state drawn (gid ``state-<key>``) and the legend."""
    try:
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as e:  # pragma: no cover - depends on the install
        raise VtallocError(f"vtalloc plot needs matplotlib: pip install 'vtalloc[plot]' ({e})") from None

    d = doc["devices"][0]
    bands = _bands(doc)
    total = sum(len(b.cells) for b in bands)
    per_cell = max(1, math.ceil(total / MAX_CELLS))
    bands = [b._replace(cells=_group(b.cells, per_cell)) for b in bands]
    n_cells = sum(len(b.cells) for b in bands)
    ids_in_cells = per_cell == 1 and n_cells <= LABELLED_CELLS
    cols = 16 if ids_in_cells else max(16, min(64, math.ceil(math.sqrt(n_cells * 2))))
    cell_in = 0.42 if ids_in_cells else min(0.2, 11.0 / cols)

    evicted = {s["session_id"]: s["evicted_pages"] if s["reported"] else 0 for s in doc["sessions"]}
    label_rows = 7.5 * 1.25 / 72 / cell_in  # the height of one line of a band's label, in rows
    boxes: dict[str, list[Any]] = {k: [] for k in STATES}
    texts, notes, y, rows = [], [], 0.0, 0
    for b in bands:
        by_count = any(c.page_id is None for c in b.cells)  # a report in counts: ids not per cell
        label = b.label + (f"\n{b.ids}" + (" (states by count)" if by_count else "")
                           if b.ids and (by_count or not ids_in_cells) else "")
        notes.append((-0.4, y + 0.5 if "\n" not in label else y, label, "right", "black"))
        n_away = evicted.get(b.session_id, 0) if b.session_id is not None else 0
        if n_away:  # after the band's last cell
            last = len(b.cells) - 1
            notes.append(((last % cols) + 1.4 if b.cells else 0.4, y + max(0, last) // cols + 0.5,
                          f"+ {n_away} pages evicted to host ({_mib(n_away * d['page_bytes'])})", "left", "#8C4A00"))
        for i, c in enumerate(b.cells):
            x, row = i % cols, y + i // cols
            boxes[c.state].append(Rectangle((x, row), 1, 1))
            if ids_in_cells and c.page_id is not None:
                texts.append((x + 0.5, row + 0.5, str(c.page_id), "white" if _dark(STATES[c.state].face) else "black"))
        band_rows = math.ceil(len(b.cells) / cols)
        rows += band_rows
        y += max(band_rows, (label.count("\n") + 1) * label_rows) + 0.35
    height = max(1.0, y - 0.35)

    fig = Figure(figsize=(cols * cell_in + 2.0, height * cell_in + 2.0))
    ax = fig.subplots()
    drawn = {}
    for key, st in STATES.items():
        if boxes[key]:
            pc = PatchCollection(boxes[key], facecolor=st.face, edgecolor=st.edge, linewidth=0.8, hatch=st.hatch or None)
            pc.set_gid(f"state-{key}")
            ax.add_collection(pc)
            drawn[key] = pc
    font = min(7.0, cell_in * 72 * 0.8 / max(1, max((len(t[2]) for t in texts), default=1)) / 0.6)
    for tx, ty, text, colour in texts:
        ax.text(tx, ty, text, ha="center", va="center", fontsize=font, color=colour)
    for tx, ty, text, align, colour in notes:
        ax.text(tx, ty, text, ha=align, va="center" if "\n" not in text else "top", fontsize=7.5, color=colour,
                linespacing=1.15)
    ax.set_xlim(0, cols)
    ax.set_ylim(height, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    unit = "1 page" if per_cell == 1 else f"{per_cell} pages, its colour their most common state"
    away = sum(evicted.values())
    head = (f"{d['backend']}:{d['device']}: {d['capacity_pages']} pages of {_mib(d['page_bytes'])}, "
            f"{d['free_pages']} free  (1 cell = {unit})\n"
            + (f"{away} pages evicted to host memory (not on the node)" if away else "nothing evicted to host"))
    ax.set_title(title or head, fontsize=9, loc="left")
    handles = [Patch(facecolor=STATES[k].face, edgecolor=STATES[k].edge if STATES[k].hatch else STATES[k].face,
                     hatch=STATES[k].hatch or None, label=STATES[k].label) for k in STATES if k in drawn]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, 0), ncol=2, fontsize=8,
              frameon=False, handlelength=2.2, handleheight=1.4)
    return fig, {"cells": n_cells, "pages_per_cell": per_cell, "columns": cols, "rows": rows,
                 "sessions": [s["session_id"] for s in doc["sessions"]],
                 "page_ids": "cells" if ids_in_cells else "labels", "evicted_pages": evicted}
