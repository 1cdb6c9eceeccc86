"""``vtalloc plot``: the page map as a picture (PNG), from a ``vtalloc.pages/v1`` document.

Owns the drawing only. Each cell is one page slot of the node (or ``k`` slots when the node
has more than MAX_CELLS pages: then a cell shows the first slot of its group). Cells are
grouped by session, one colour per session, in page-id order; within a session, shades give
each page's use as the client last reported it (resident, cached, unmapped, in flight;
delivering is lighter still), or, for pages a report did not cover yet, the session's counts.
Pages of hidden sessions are dark grey, free slots light grey. A second panel shows each session's evicted pages (data
held on the host, not on the node). matplotlib is imported here only (extra ``plot``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["plot_page_map", "MAX_CELLS"]

MAX_CELLS = 4096
_FREE = (0.92, 0.92, 0.92)
_HIDDEN = (0.35, 0.35, 0.35)
# state -> how much of the session colour (1 = full, lower = lighter)
_SHADES = {"resident": 1.0, "in_flight": 0.85, "delivering": 0.75, "cached": 0.5, "unmapped": 0.25, "leased": 0.6}


def _mix(rgb: tuple[float, float, float], strength: float) -> tuple[float, float, float]:
    return tuple(1.0 - strength * (1.0 - c) for c in rgb)  # type: ignore[return-value]


def _cells(doc: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """One (session id or '' / '#hidden', state) per page slot, and the session order."""
    d = doc["devices"][0]
    cells: list[tuple[str, str]] = []
    order = []
    for s in doc["sessions"]:
        mine = [p for p in doc["pages"] if p["session_id"] == s["session_id"]]
        delivering = sum(p["state"] == "delivering" for p in mine)
        held = len(mine) - delivering
        order.append(s["session_id"])
        held_pages = [p for p in mine if p["state"] != "delivering"]
        if held_pages and all(p.get("use", "unknown") != "unknown" for p in held_pages):
            cells += [(s["session_id"], p["use"]) for p in sorted(held_pages, key=lambda p: p["page_id"])]
        elif s["reported"]:
            counts = [("resident", s["resident_pages"]), ("cached", s["cached_pages"]),
                      ("unmapped", s["unmapped_pages"])]
            known = sum(n for _, n in counts)
            # Reports lag leases by up to one interval: pages not in the last report are "leased".
            counts.append(("leased", max(0, held - known)))
            left = held
            for state, n in counts:
                n = min(n, left)
                cells += [(s["session_id"], state)] * n
                left -= n
        else:
            cells += [(s["session_id"], "leased")] * held
        cells += [(s["session_id"], "delivering")] * delivering
    cells += [("#hidden", "leased")] * doc["hidden_pages"]
    cells += [("", "free")] * max(0, d["capacity_pages"] - len(cells))
    return cells, order


def plot_page_map(doc: dict[str, Any], out: str, *, title: str | None = None) -> dict[str, Any]:
    """Draw ``doc`` (a vtalloc.pages/v1 document) to ``out`` (PNG); returns what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    d = doc["devices"][0]
    cells, order = _cells(doc)
    per_cell = max(1, math.ceil(len(cells) / MAX_CELLS))
    cells = cells[::per_cell]
    cols = max(8, min(64, math.ceil(math.sqrt(len(cells) * 2))))
    rows = max(1, math.ceil(len(cells) / cols))
    palette = plt.get_cmap("tab10" if len(order) <= 10 else "tab20")
    colour = {sid: palette(i % palette.N)[:3] for i, sid in enumerate(order)}
    grid = [[(1.0, 1.0, 1.0)] * cols for _ in range(rows)]
    for i, (sid, state) in enumerate(cells):
        if sid == "":
            rgb = _FREE
        elif sid == "#hidden":
            rgb = _HIDDEN
        else:
            rgb = _mix(colour[sid], _SHADES[state])
        grid[i // cols][i % cols] = rgb

    evicted = [(s["session_id"], s["evicted_pages"] if s["reported"] else 0) for s in doc["sessions"]]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, max(3.5, 0.22 * rows + 2.2)),
                                  gridspec_kw={"width_ratios": [4, 1]})
    ax.imshow(grid, interpolation="nearest", aspect="equal")
    ax.set_xticks([x - 0.5 for x in range(cols + 1)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(rows + 1)], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.6)
    ax.tick_params(which="both", bottom=False, left=False, labelbottom=False, labelleft=False)
    unit = "page" if per_cell == 1 else f"{per_cell} pages"
    ax.set_title(title or f"{d['backend']}:{d['device']}  {d['capacity_pages']} pages of "
                 f"{d['page_bytes'] >> 20} MiB, {d['free_pages']} free  (1 cell = 1 {unit})", fontsize=10)
    who = {s["session_id"]: f"{s['principal']}, pid {s['pid']}" for s in doc["sessions"]}
    handles = [Patch(color=colour[sid], label=f"session {sid} ({who[sid]})") for sid in order]
    handles += [Patch(color=_mix((0.15, 0.15, 0.15), _SHADES[st]), label=label)
                for st, label in (("resident", "resident"), ("cached", "cached"), ("unmapped", "unmapped"),
                                  ("in_flight", "in flight"), ("leased", "not yet reported"),
                                  ("delivering", "delivering"))]
    handles += [Patch(color=_HIDDEN, label="other users"), Patch(color=_FREE, label="free")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, -0.02), ncol=3, fontsize=8, frameon=False)

    ax2.barh([f"{sid}" for sid, _ in evicted] or ["(no sessions)"], [n for _, n in evicted] or [0],
             color=[colour[sid] for sid, _ in evicted] or [_FREE])
    ax2.set_title("evicted to host (pages)", fontsize=10)
    ax2.set_xlim(0, max([n for _, n in evicted] + [1]) * 1.1)
    ax2.xaxis.get_major_locator().set_params(integer=True)
    ax2.invert_yaxis()
    ax2.tick_params(labelsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return {"cells": len(cells), "pages_per_cell": per_cell, "columns": cols, "rows": rows, "sessions": order}
