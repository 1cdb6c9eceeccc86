"""``vtalloc evict``: forced eviction, asking a session to give pages back now (admin).

Owns: evict's options and its answer (render.EVICT_SCHEMA).
Invariants: it waits up to its own ``--timeout`` (30 s by default: the session has the
daemon's eviction deadline to answer, and a kill may follow).
"""

from __future__ import annotations

from typing import Optional

import typer

from . import render
from .commands_common import CommandContext, emit_json, open_session, socket_opt

__all__ = ["register"]


def register(app: typer.Typer, ctx: CommandContext) -> None:
    @ctx.command(app)
    def evict(
        session_id: str = typer.Argument(..., help="The session to ask (see `vtalloc stats`)."),
        pages_: int = typer.Option(0, "--pages", min=0, help="Pages to ask back (0: all above its guaranteed "
                                   "minimum)."),
        kill_on_miss: bool = typer.Option(False, "--kill-on-miss", help="Kill the client if it misses the deadline."),
        socket: Optional[str] = socket_opt,
        timeout: float = typer.Option(30.0, "--timeout", min=0.1, help="Seconds to wait for the answer."),
        json_out: bool = typer.Option(False, "--json", help=f"Print JSON ({render.EVICT_SCHEMA})."),
    ) -> None:
        """Forced eviction: ask a session to give pages back now (admin)."""
        from vtalloc.server.proto.vtalloc.v1 import admin_pb2

        with open_session(socket, timeout) as session:
            r = session.call(session.admin, "EvictSession", admin_pb2.EvictSessionRequest(
                session_id=session_id, pages=pages_, kill_on_miss=kill_on_miss), timeout)
        doc = {"schema": render.EVICT_SCHEMA, "session_id": session_id, "asked": r.asked, "returned": r.returned,
               "missed": r.missed, "killed": r.killed}
        if json_out:
            emit_json(doc)
        else:
            ctx.console.print(f"session {session_id}: asked {r.asked} pages, {r.returned} given back"
                          + (", missed the deadline" if r.missed else "") + (", killed" if r.killed else ""))
