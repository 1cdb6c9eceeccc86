"""``vtalloc quota get`` and ``vtalloc quota set``: read or set per-principal quotas.

Owns: the ``quota`` sub-app and its two commands' options.
Invariants: a quota is parsed (and refused, exit 2) before the daemon is asked; setting needs
an admin uid, which the daemon checks.
"""

from __future__ import annotations

from typing import Optional

import typer

from . import render
from .commands_common import CommandContext, emit_json, open_session, socket_opt, timeout_opt, wide_opt

__all__ = ["register"]


def register(app: typer.Typer, ctx: CommandContext) -> None:
    quota_app = typer.Typer(help="Read or set per-principal quotas (setting needs an admin uid).",
                            no_args_is_help=True, rich_markup_mode=app.rich_markup_mode)
    app.add_typer(quota_app, name="quota")

    @ctx.command(quota_app, "get")
    def quota_get(
        principal: str = typer.Argument("", help="uid:<n> or a configured name (default: your own)."),
        all_: bool = typer.Option(False, "--all", help="Every configured principal (admin)."),
        socket: Optional[str] = socket_opt,
        timeout: float = timeout_opt,
        json_out: bool = typer.Option(False, "--json", help=f"Print JSON ({render.QUOTA_SCHEMA})."),
        wide: bool = wide_opt,
    ) -> None:
        """Show a principal's guaranteed minimum and hard maximum."""
        from vtalloc.server.proto.vtalloc.v1 import admin_pb2

        with open_session(socket, timeout) as session:
            msg = session.call(session.admin, "GetQuota", admin_pb2.GetQuotaRequest(principal="*" if all_ else principal))
        doc = render.quota_doc(msg)
        if json_out:
            emit_json(doc)
        else:
            ctx.show(render.quota_tables(doc, ctx.width(wide)), wide)

    @ctx.command(quota_app, "set")
    def quota_set(
        principal: str = typer.Argument(..., help="uid:<n> or a configured name."),
        min_: str = typer.Option(..., "--min", help="Guaranteed bytes, e.g. 2GiB (0 for none)."),
        max_: str = typer.Option(..., "--max", help="Hard maximum bytes, e.g. 16GiB."),
        socket: Optional[str] = socket_opt,
        timeout: float = timeout_opt,
        json_out: bool = typer.Option(False, "--json", help=f"Print JSON ({render.QUOTA_SCHEMA})."),
        wide: bool = wide_opt,
    ) -> None:
        """Set a principal's guaranteed minimum and hard maximum (admin)."""
        from vtalloc.server.proto.vtalloc.v1 import admin_pb2
        from vtalloc.server.quota import parse_quota

        q = parse_quota(f"{min_}:{max_}", principal=principal)
        with open_session(socket, timeout) as session:
            msg = session.call(session.admin, "SetQuota", admin_pb2.SetQuotaRequest(
                principal=principal, min_bytes=q.min_bytes, max_bytes=q.max_bytes))
            default = session.call(session.admin, "GetQuota", admin_pb2.GetQuotaRequest(principal=principal))
        doc = render.quota_doc(admin_pb2.QuotaList(quotas=[msg], default_quota=default.default_quota))
        if json_out:
            emit_json(doc)
        else:
            ctx.show(render.quota_tables(doc, ctx.width(wide)), wide)
