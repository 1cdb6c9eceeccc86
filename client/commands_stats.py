"""``vtalloc stats`` and ``vtalloc top``: the node's page stats, once, repeated or live.

Owns: their options, the samples loop (``--watch``/``--count``/``--interval``), and the stats a
process publishes itself (``--pid``, no daemon).
Invariants: ``--json`` prints one document per sample and line (render.STATS_SCHEMA, or
render.PROC_SCHEMA with --pid); off a terminal ``top`` prints each refresh below the last.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

import typer
from rich.console import Group

from vtalloc.allocator.errors import VtallocError

from . import render
from .commands_common import (EXIT_INTERRUPTED, CommandContext, emit_json, open_session, socket_opt, timeout_opt,
                              wide_opt)

__all__ = ["register"]


def node_stats(session: Any, session_id: str) -> dict[str, Any]:
    from vtalloc.server.proto.vtalloc.v1 import pages_pb2

    return render.stats_doc(session.call(session.pages, "GetStats", pages_pb2.GetStatsRequest(session_id=session_id)))

def proc_stats(pid: int) -> dict[str, Any]:
    from vtalloc.allocator.publish import PUBLISH_ENV, read_published, record_path

    try:
        record = read_published(pid)
    except FileNotFoundError:
        raise VtallocError(f"process {pid} publishes no vtalloc stats at {record_path(pid)} (start it with "
                           f"{PUBLISH_ENV}=1, or call vtalloc.allocator.publish.publish_stats(space))") from None
    except (ValueError, OSError) as e:
        raise VtallocError(f"cannot read the stats of process {pid}: {e}") from None
    try:
        os.kill(pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    except PermissionError:
        alive = True
    return render.proc_doc(record, alive=alive)

def samples(fetch: Callable[[], dict[str, Any]], watch: Optional[float], count: Optional[int]):
    n = count if count is not None else (None if watch else 1)
    i = 0
    while n is None or i < n:
        if i:
            time.sleep(watch or 1.0)
        yield fetch()
        i += 1


def register(app: typer.Typer, ctx: CommandContext) -> None:
    @ctx.command(app)
    def stats(
        socket: Optional[str] = socket_opt,
        timeout: float = timeout_opt,
        watch: Optional[float] = typer.Option(None, "--watch", "-w", min=0.05, help="Repeat every SECS seconds."),
        count: Optional[int] = typer.Option(None, "--count", "-c", min=1, help="Stop after N samples "
                                            "(default: 1, or unlimited with --watch)."),
        session_id: str = typer.Option("", "--session", help="Only this session."),
        pid: Optional[int] = typer.Option(None, "--pid", min=1, help="No daemon: the stats process PID publishes "
                                          "(VTALLOC_PUBLISH_STATS=1)."),
        json_out: bool = typer.Option(False, "--json", help=f"Print JSON ({render.STATS_SCHEMA}; with --pid "
                                      f"{render.PROC_SCHEMA}), one document per line."),
        wide: bool = wide_opt,
    ) -> None:
        """Page stats per device and per session: capacity, resident/evicted/free pages, quotas, evictions."""
        if pid is not None:
            for doc in samples(lambda: proc_stats(pid), watch, count):
                if json_out:
                    emit_json(doc)
                else:
                    ctx.show(render.proc_tables(doc, ctx.width(wide)), wide)
            return
        with open_session(socket, timeout) as session:
            for doc in samples(lambda: node_stats(session, session_id), watch, count):
                if json_out:
                    emit_json(doc)
                else:
                    if watch:
                        ctx.console.rule(time.strftime("%H:%M:%S"))
                    ctx.show(render.stats_tables(doc, ctx.width(wide)), wide)

    @ctx.command(app)
    def top(
        socket: Optional[str] = socket_opt,
        timeout: float = timeout_opt,
        interval: float = typer.Option(1.0, "--interval", "-i", min=0.05, help="Seconds between refreshes."),
        count: Optional[int] = typer.Option(None, "--count", "-c", min=1, help="Stop after N refreshes."),
        json_out: bool = typer.Option(False, "--json", help=f"Print one {render.STATS_SCHEMA} document per refresh."),
        wide: bool = wide_opt,
    ) -> None:
        """A live view of the node's pages and sessions (Ctrl-C to quit).

        On a terminal the view redraws in place; when stdout is not a terminal (a pipe, a file,
        `timeout`) each refresh prints one snapshot below the last, flushed at once.
        """
        from rich.live import Live

        with open_session(socket, timeout) as session:
            docs = samples(lambda: node_stats(session, ""), interval, count)
            if json_out:
                for doc in docs:
                    emit_json(doc)
                return

            def head() -> str:
                return f"vtalloc top  {time.strftime('%H:%M:%S')}  every {interval:g}s"

            if not ctx.console.is_terminal:
                for n, doc in enumerate(docs):
                    if n:
                        ctx.console.print()
                    ctx.console.rule(head(), align="left")
                    ctx.show(render.stats_tables(doc, ctx.width(wide)), wide)
                    ctx.console.file.flush()
                return
            interrupted = False
            with Live(console=ctx.console, auto_refresh=False) as live:
                try:
                    for doc in docs:
                        live.update(Group(head() + "  (Ctrl-C to quit)", *render.stats_tables(doc, ctx.width(wide))),
                                    refresh=True)
                except KeyboardInterrupt:
                    interrupted = True
            if interrupted:  # after Live has put the terminal back
                raise typer.Exit(EXIT_INTERRUPTED)
