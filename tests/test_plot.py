"""`vtalloc plot`: what the picture shows, checked on its matplotlib artists and its files."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_rgba  # noqa: E402

from vtalloc.allocator import InvalidArgumentError  # noqa: E402
from vtalloc.client.plot import (  # noqa: E402
    LABELLED_CELLS, MAX_CELLS, STATES, output_format, page_map_figure, plot_page_map,
)


def page_map(capacity: int, sessions: list[tuple[str, list[str], int]], *, hidden: int = 0, inherited: int = 0,
             first_id: int = 1) -> dict:
    """A vtalloc.pages/v1 document: each session (id, per-page uses, evicted pages); a use of
    "delivering" is a page being handed over, "unknown" one leased since the last report."""
    pages, sessions_out, page_id = [], [], first_id
    for n, (sid, uses, evicted) in enumerate(sessions):
        for use in uses:
            pages.append({"page_id": page_id, "session_id": sid,
                          "state": "delivering" if use == "delivering" else "leased",
                          "use": "unknown" if use == "delivering" else use})
            page_id += 1
        page_id += 5  # ids are never reused: a session's pages need not follow the previous one's
        sessions_out.append({"session_id": sid, "principal": f"uid:{1000 + n}", "pid": 4000 + n, "reported": True,
                             "resident_pages": uses.count("resident"), "cached_pages": uses.count("cached"),
                             "unmapped_pages": uses.count("unmapped"), "evicted_pages": evicted})
    free = capacity - len(pages) - hidden - inherited
    return {"schema": "vtalloc.pages/v1", "pages": pages, "sessions": sessions_out, "hidden_pages": hidden,
            "devices": [{"backend": "host", "device": 0, "page_bytes": 2 << 20, "capacity_pages": capacity,
                         "free_pages": free, "inherited_pages": inherited}]}


EVERY_STATE = page_map(
    64, [("a1", ["resident"] * 4 + ["cached"] * 3 + ["unmapped"] * 2 + ["in_flight"], 3),
         ("b2", ["resident"] * 2 + ["unknown", "delivering"], 0)], hidden=5, inherited=2)


def state_of(label: str) -> str:
    return next(k for k, st in STATES.items() if st.label == label)


def test_every_legend_swatch_is_drawn_like_the_cells_of_its_state():
    fig, drawn = page_map_figure(EVERY_STATE)
    ax = fig.axes[0]
    cells = {c.get_gid().removeprefix("state-"): c for c in ax.collections}
    legend = ax.get_legend()
    swatches = {state_of(t.get_text()): h for t, h in zip(legend.get_texts(), legend.legend_handles)}
    assert set(swatches) == set(cells) == set(STATES)  # every state is drawn here, and listed once
    for key, collection in cells.items():
        face = collection.get_facecolor()
        assert len(face) == 1 and tuple(face[0]) == to_rgba(STATES[key].face)
        assert tuple(swatches[key].get_facecolor()) == tuple(face[0]), key
        assert (swatches[key].get_hatch() or "") == (collection.get_hatch() or ""), key


def test_the_legend_lists_only_the_states_drawn():
    fig, _ = page_map_figure(page_map(16, [("a1", ["resident", "resident", "cached"], 0)]))
    labels = {state_of(t.get_text()) for t in fig.axes[0].get_legend().get_texts()}
    assert labels == {"resident", "cached", "free"}


def test_states_are_told_apart_by_colour_or_hatch():
    looks = [(st.face.lower(), st.hatch) for st in STATES.values()]
    assert len(set(looks)) == len(looks)
    for (ka, a), (kb, b) in itertools.combinations(STATES.items(), 2):
        if a.hatch == b.hatch:  # same hatch: the fills must differ clearly
            ra, rb = to_rgba(a.face), to_rgba(b.face)
            assert sum((x - y) ** 2 for x, y in zip(ra[:3], rb[:3])) ** 0.5 > 0.2, (ka, kb)


def test_page_ids_are_written_in_small_maps_and_listed_in_large_ones():
    fig, drawn = page_map_figure(EVERY_STATE)
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert drawn["page_ids"] == "cells"
    assert {str(p["page_id"]) for p in EVERY_STATE["pages"]} <= texts
    big = page_map(2048, [("a1", ["resident"] * 500, 0), ("b2", ["cached"] * 40, 0)], first_id=7)
    fig, drawn = page_map_figure(big)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert drawn["page_ids"] == "labels" and drawn["cells"] > LABELLED_CELLS
    assert any("session a1" in t and "ids 7-506" in t for t in labels)
    assert any("session b2" in t and "ids 512-551" in t for t in labels)


def test_a_report_in_counts_only_is_drawn_by_count_with_the_ids_beside():
    doc = page_map(24, [("old", ["unknown"] * 6, 0)])
    doc["sessions"][0].update(resident_pages=3, cached_pages=1, unmapped_pages=1)
    fig, _ = page_map_figure(doc)
    ax = fig.axes[0]
    assert {c.get_gid(): len(c.get_paths()) for c in ax.collections} == {
        "state-resident": 3, "state-cached": 1, "state-unmapped": 1, "state-leased": 1, "state-free": 18}
    texts = [t.get_text() for t in ax.texts]
    assert any("ids 1-6 (states by count)" in t for t in texts) and "1" not in texts


def test_a_node_past_max_cells_groups_pages_and_still_shows_every_state():
    doc = page_map(3 * MAX_CELLS, [("a1", ["resident"] * 900 + ["cached"] * 300, 0)])
    fig, drawn = page_map_figure(doc)
    assert drawn["pages_per_cell"] == 3 and drawn["cells"] <= MAX_CELLS
    assert {c.get_gid() for c in fig.axes[0].collections} == {"state-resident", "state-cached", "state-free"}


def test_evicted_pages_are_noted_by_their_session_and_no_empty_panel_is_drawn():
    fig, drawn = page_map_figure(page_map(16, [("a1", ["resident"], 0)]))
    assert len(fig.axes) == 1 and drawn["evicted_pages"] == {"a1": 0}
    assert "nothing evicted to host" in fig.axes[0].get_title(loc="left")
    assert not [t for t in fig.axes[0].texts if "evicted" in t.get_text()]
    fig, drawn = page_map_figure(EVERY_STATE)
    assert len(fig.axes) == 1 and drawn["evicted_pages"] == {"a1": 3, "b2": 0}
    assert "3 pages evicted to host memory" in fig.axes[0].get_title(loc="left")
    assert [t.get_text() for t in fig.axes[0].texts if "evicted" in t.get_text()] == [
        "+ 3 pages evicted to host (6 MiB)"]


@pytest.mark.parametrize("ext, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml"), (".pdf", b"%PDF-"),
                                        (".PNG", b"\x89PNG\r\n\x1a\n")])
def test_each_format_is_written_by_its_extension(tmp_path, ext, magic):
    out = tmp_path / f"map{ext}"
    drawn = plot_page_map(EVERY_STATE, str(out))
    data = out.read_bytes()
    assert data.startswith(magic) and len(data) > 2000 and drawn["format"] == ext[1:].lower()
    if ext == ".svg":
        assert b"<svg" in data[:2000]


@pytest.mark.parametrize("name", ["map.jpg", "map", "map.png.txt", "map.svgz"])
def test_an_unknown_extension_is_a_typed_error_before_drawing(tmp_path, name):
    with pytest.raises(InvalidArgumentError, match="extension"):
        output_format(str(tmp_path / name))
    with pytest.raises(InvalidArgumentError):
        plot_page_map(EVERY_STATE, str(tmp_path / name))
    assert not (tmp_path / name).exists()


def test_the_cli_draws_two_sessions_page_by_page_with_their_ids(tmp_path):
    """Live: the second session's report speaks of its own page ids (not the client's tags), so
    every page is drawn by its use and id; the picture is written in the format its name asks."""
    import json

    from helpers.service import Daemon, wait_until
    from typer.testing import CliRunner

    from vtalloc.client import ServiceAddressSpace
    from vtalloc.client.cli import app

    def cli(*args):
        r = CliRunner().invoke(app, list(args), env={"VTALLOC_SOCKET": d.socket})
        assert r.exit_code == 0, (r.stdout, r.stderr)
        return json.loads(r.stdout)

    with Daemon(capacity="32MiB") as d, \
            ServiceAddressSpace(d.address, lease_batch_pages=1, report_interval_s=0.05) as a, \
            ServiceAddressSpace(d.address, lease_batch_pages=1, keep_free_pages=8, report_interval_s=0.05) as b:
        a.malloc(a.page_bytes)
        b.malloc(2 * b.page_bytes)
        b.free(b.malloc(b.page_bytes))
        want = {a.session.session_id: ["resident"], b.session.session_id: ["cached", "resident", "resident"]}

        def reported():
            pages = cli("pages", "--json")["pages"]
            uses = {sid: sorted(p["use"] for p in pages if p["session_id"] == sid) for sid in want}
            return uses == want and pages
        pages = wait_until(reported, 10, interval_s=0.05)
        doc = cli("plot", "--out", str(tmp_path / "map.svg"), "--json")
    svg = (tmp_path / "map.svg").read_text()
    assert doc["format"] == "svg" and doc["page_ids"] == "cells" and svg.startswith("<?xml")
    assert all(f">{p['page_id']}<" in svg or f"<!-- {p['page_id']} -->" in svg for p in pages)
