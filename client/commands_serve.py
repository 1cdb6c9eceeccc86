"""``vtalloc serve``: run the per-node daemon.

Owns: serve's options and how they become a DaemonConfig; the only CLI command that imports
the daemon (vtalloc.server), inside the command.
Invariants: a bad option value is a usage error (exit 2), also when the backend judges it
(page size, capacity, quotas); a runtime failure (the socket directory, another daemon, the
backend) exits 1.
"""

from __future__ import annotations

import signal
from typing import Any, Optional

import typer

from vtalloc.allocator.config import Config, parse_size
from vtalloc.allocator.errors import InvalidArgumentError, VtallocError

from . import render
from .commands_common import BACKEND_HELP, Backend, CommandContext, socket_opt

__all__ = ["register"]


def register(app: typer.Typer, ctx: CommandContext) -> None:
    @app.command()
    def serve(
        socket: Optional[str] = socket_opt,
        backend: Backend = typer.Option("auto", help=BACKEND_HELP),
        device: int = typer.Option(0, help="CUDA device ordinal; run one daemon per device."),
        capacity: Optional[str] = typer.Option(None, help="Bytes of pages the node leases, e.g. 60GiB, rounded "
                                               "down to whole pages (default: the backend's; host: 1 GiB)."),
        page_size: Optional[str] = typer.Option(None, help="Bytes per page (default: the backend's granularity)."),
        host_capacity: Optional[str] = typer.Option(None, help="Host bytes each client may use for evicted pages "
                                                    "(default: the client's own default)."),
        metrics_port: Optional[int] = typer.Option(None, help="Serve Prometheus metrics on this port (0: any free "
                                                   "port, printed in the ready line)."),
        metrics_addr: str = typer.Option("127.0.0.1", help="Address the metrics server binds (on 127.0.0.1 "
                                         "every local user can reach it, not only --group; at most 16 "
                                         "connections, idle 5 s, 10 s each)."),
        group: Optional[str] = typer.Option(None, help="Group allowed to reach the sockets: a socket directory the "
                                            "daemon creates gets it (mode 0750); an existing one is never changed "
                                            "and must have it already."),
        admin_uid: list[int] = typer.Option([], help="A uid allowed admin calls, besides root and the daemon's own "
                                            "(repeatable)."),
        quota: list[str] = typer.Option([], help="PRINCIPAL=MIN:MAX, e.g. uid:1000=1GiB:8GiB (repeatable)."),
        default_quota: Optional[str] = typer.Option(None, help="MIN:MAX for principals without their own "
                                                    "(default 0:capacity)."),
        principal: list[str] = typer.Option([], help="NAME=UID[,UID...]: these uids count as one principal "
                                            "(repeatable)."),
        principal_by: str = typer.Option("uid", help="How a client is identified for quotas, limits and who sees "
                                         "whose sessions: uid (its Unix uid), or pod (a client whose cgroup v2 "
                                         "path is a Kubernetes pod's, systemd or cgroupfs kubelet layout, is "
                                         "principal pod:<pod UID>, its pod's containers together; others stay "
                                         "uid:<n>). With pod, a session also sees only its own uid's sessions, and "
                                         "an admin uid is admin only in the daemon's own cgroup or an "
                                         "--admin-cgroup. See docs/kubernetes.md."),
        admin_cgroup: list[str] = typer.Option([], help="With --principal-by pod: a cgroup path (and everything "
                                               "below it, e.g. /user.slice) whose admin uids may make admin calls, "
                                               "besides the daemon's own cgroup (repeatable)."),
        evict_deadline: float = typer.Option(2.0, help="Seconds a client has to answer an eviction request."),
        kill: bool = typer.Option(True, "--kill/--no-kill", help="Kill a client that misses an eviction deadline "
                                  "when that is needed to honour another principal's guaranteed minimum."),
        max_sessions_per_uid: int = typer.Option(256, help="Sessions one uid may hold open at once (client and "
                                                 "observer sessions, root's too); one more is refused with "
                                                 "LimitExceededError."),
        max_pending_per_uid: int = typer.Option(16, help="Side-channel connections of one uid that have not said "
                                                "hello yet; one more is refused for the moment (its client "
                                                "tries again until its timeout, then raises "
                                                "LimitExceededError)."),
        hello_timeout: float = typer.Option(2.0, help="Seconds a new side-channel connection has to say hello "
                                            "before the daemon drops it."),
        max_message_bytes: str = typer.Option("4MiB", help="Largest gRPC request the daemon reads (2MiB .. 1GiB); "
                                              "a larger one gets RESOURCE_EXHAUSTED."),
        max_concurrent_rpcs: int = typer.Option(4096, help="gRPC calls of non-admin uids served at once, counted "
                                                "after each uid's own limit; more get RESOURCE_EXHAUSTED."),
        max_rpcs_per_uid: int = typer.Option(512, help="gRPC calls one uid may have in progress at once (root's "
                                             "too; calls without a session share one such limit); more get "
                                             "RESOURCE_EXHAUSTED."),
        log_level: str = typer.Option("info", help="debug, info, warning or error."),
    ) -> None:
        """Run the per-node daemon: lease pages to clients, enforce quotas, reclaim crashed clients' pages.

        Prints one JSON line on stdout when ready; stops cleanly on SIGTERM or Ctrl-C.
        """
        from vtalloc.server.daemon import DaemonConfig, run_daemon
        from vtalloc.server.limits import SessionLimits
        from vtalloc.server.protocol.address import default_socket_path
        from vtalloc.server.quota import parse_named_quota, parse_principal_map, parse_quota

        try:
            config = DaemonConfig(
                socket_path=socket or default_socket_path(),
                pages=Config(backend=backend.value, device=device, capacity=capacity, page_size=page_size),
                host_capacity=host_capacity, metrics_port=metrics_port, metrics_addr=metrics_addr, group=group,
                admin_uids=tuple(admin_uid),
                default_quota=parse_quota(default_quota) if default_quota else None,
                quotas=tuple(parse_named_quota(q) for q in quota), principals=parse_principal_map(principal),
                evict_deadline_s=evict_deadline, kill_on_missed_deadline=kill,
                max_message_bytes=max_message_bytes, max_concurrent_rpcs=max_concurrent_rpcs,
                principal_by=principal_by, admin_cgroups=tuple(admin_cgroup),
                limits=SessionLimits(max_sessions_per_uid=max_sessions_per_uid,
                                     max_pending_per_uid=max_pending_per_uid, hello_timeout_s=hello_timeout,
                                     max_rpcs_per_uid=max_rpcs_per_uid))
            if log_level.lower() not in ("debug", "info", "warning", "error"):
                raise InvalidArgumentError(f"--log-level: {log_level!r} is not debug, info, warning or error")
        except InvalidArgumentError as e:
            raise typer.BadParameter(str(e)) from None
        def note(ready: dict[str, Any]) -> None:
            if capacity is not None:
                line = render.rounding_note("--capacity", capacity, parse_size(capacity), ready["capacity_bytes"],
                                            ready["page_bytes"])
                if line:
                    ctx.err_console.print(line, highlight=False, soft_wrap=True)

        try:
            stopped_by = run_daemon(config, log_level=log_level, then=note)
        except InvalidArgumentError as e:  # an option the backend judged (page size, capacity, quotas)
            if ctx.is_debug():
                raise
            ctx.fail(str(e), 2)
        except (VtallocError, OSError) as e:  # the socket directory, another daemon, the backend: runtime
            if ctx.is_debug():
                raise
            ctx.fail(str(e), 1)
        if stopped_by == signal.SIGINT:  # Ctrl-C: the shell's convention (128 + SIGINT), as every command
            raise typer.Exit(130)
