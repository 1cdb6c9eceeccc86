"""``vtalloc pages`` and ``vtalloc plot``: the page map, as tables, JSON, a torch snapshot or a picture.

Owns: their options and the one ``ListPages`` call both make.
Invariants: ``--format torch`` needs ``--out`` and ``--out`` needs it; a bad plot extension is
refused before the daemon is asked.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import typer

from vtalloc.allocator.errors import InvalidArgumentError

from . import render
from .commands_common import CommandContext, PagesFormat, emit_json, open_session, socket_opt, timeout_opt, wide_opt

__all__ = ["register"]


def page_map(socket: Optional[str], timeout: float, session_id: str) -> dict[str, Any]:
    from vtalloc.server.proto.vtalloc.v1 import pages_pb2

    with open_session(socket, timeout) as session:
        return render.pages_doc(session.call(session.pages, "ListPages",
                                             pages_pb2.ListPagesRequest(session_id=session_id)))


def register(app: typer.Typer, ctx: CommandContext) -> None:
    @ctx.command(app)
    def pages(
        socket: Optional[str] = socket_opt,
        timeout: float = timeout_opt,
        session_id: str = typer.Option("", "--session", help="Only this session's pages."),
        json_out: bool = typer.Option(False, "--json", help=f"Print JSON ({render.PAGES_SCHEMA})."),
        wide: bool = wide_opt,
        fmt: PagesFormat = typer.Option(
            PagesFormat.table, "--format",
            help="table; json (as --json); torch: PyTorch's memory snapshot, pickled to --out, for "
                 "`python -m torch.cuda._memory_viz stats|segments|segment_plot FILE`."),
        out: Optional[str] = typer.Option(None, "--out", "-o", help="The file --format torch writes."),
    ) -> None:
        """The page map: which session holds which pages, and in what state."""
        if fmt is PagesFormat.torch and not out:
            raise InvalidArgumentError("--format torch writes a pickle: name the file with --out")
        if out and fmt is not PagesFormat.torch:
            raise InvalidArgumentError("--out is for --format torch")
        doc = page_map(socket, timeout, session_id)
        if fmt is PagesFormat.torch and out:
            import pickle

            from .torch_snapshot import pages_snapshot

            snapshot = pages_snapshot(doc)
            with open(out, "wb") as f:
                pickle.dump(snapshot, f)
            ctx.console.print(f"wrote {out}: {len(snapshot['segments'])} segments (torch.cuda._memory_viz)")
            return
        if json_out or fmt is PagesFormat.json:
            emit_json(doc)
            return
        ctx.show(render.pages_tables(doc, ctx.width(wide)), wide)

    @ctx.command(app)
    def plot(
        out: str = typer.Option(..., "--out", "-o", help="The file to write: .png, .svg or .pdf."),
        socket: Optional[str] = socket_opt,
        timeout: float = timeout_opt,
        session_id: str = typer.Option("", "--session", help="Only this session's pages."),
        json_out: bool = typer.Option(False, "--json", help="Print what was drawn as JSON (vtalloc.plot/v1)."),
    ) -> None:
        """Draw the page map (each page's state and id, by session; evicted counts) to a PNG, SVG or PDF file."""
        from .plot import output_format, plot_page_map

        output_format(out)  # a bad extension is refused before the daemon is asked
        doc = page_map(socket, timeout, session_id)
        drawn = plot_page_map(doc, out)
        if json_out:
            emit_json({"schema": "vtalloc.plot/v1", "out": os.path.abspath(out), **drawn, "page_map": doc})
        else:
            ctx.console.print(f"wrote {out}: {drawn['cells']} cells, {len(drawn['sessions'])} sessions")
