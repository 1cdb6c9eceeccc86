"""``vtalloc health``: is the daemon serving?

Owns: the health check (gRPC health checking, then a session on the side channel) and its
answer (render.HEALTH_SCHEMA).
Invariants: nothing is sent to a daemon this user does not trust (``verify_daemon`` first);
exit 0 only when the server is SERVING and a side-channel session opens.
"""

from __future__ import annotations

from typing import Optional

import typer
from rich.text import Text

from vtalloc.allocator.errors import VtallocError

from . import render
from .commands_common import CommandContext, emit_json, open_session, socket_opt, timeout_opt

__all__ = ["register"]


def register(app: typer.Typer, ctx: CommandContext) -> None:
    @ctx.command(app)
    def health(
        socket: Optional[str] = socket_opt,
        timeout: float = timeout_opt,
        json_out: bool = typer.Option(False, "--json", help=f"Print JSON ({render.HEALTH_SCHEMA})."),
    ) -> None:
        """Is the daemon serving? (gRPC health checking, then a session on the side channel.) Exit 0 if so."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from vtalloc.server.protocol.address import UNIX_SCHEME, default_socket_path, parse_address
        from vtalloc.server.protocol.rpc import SERVICE_NAMES

        from .session import verify_daemon

        path = parse_address(socket or default_socket_path())
        services: dict[str, str] = {"(server)": "UNREACHABLE"}
        side_ok, side_error = True, None
        try:
            verify_daemon(path, timeout)  # nothing is sent to a daemon this user does not trust
        except VtallocError as e:
            side_ok, side_error = False, str(e)
        if side_ok:
            with grpc.insecure_channel(UNIX_SCHEME + path) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                for name in ("", *SERVICE_NAMES):
                    try:
                        r = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=timeout)
                        services[name or "(server)"] = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
                    except grpc.RpcError as e:
                        services[name or "(server)"] = "UNREACHABLE" if e.code() == grpc.StatusCode.UNAVAILABLE \
                            else e.code().name
            try:
                open_session(socket, timeout).close()
            except VtallocError as e:
                side_ok, side_error = False, str(e)
        status = services["(server)"] if side_ok else "UNREACHABLE"
        doc = {"schema": render.HEALTH_SCHEMA, "address": UNIX_SCHEME + path, "status": status,
               "services": services, "side_channel": side_ok, "error": side_error}
        if json_out:
            emit_json(doc)
        else:
            style = "green" if status == "SERVING" else "red"
            ctx.console.print(Text.assemble((status, style), f" {UNIX_SCHEME}{path}",
                                            f"  ({side_error})" if side_error else ""))
        if status != "SERVING":
            raise typer.Exit(1)
