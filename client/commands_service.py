"""The service commands of ``vtalloc``: serve, stats, top, pages, plot, quota, evict, health.

Owns: their options and the loop around each call; the RPCs are in session.py, the output
in render.py, the picture in plot.py. Registered on the main app by ``register(app, ...)``
(client/cli.py), so this file is the only one to change for the service's commands.
Exit codes: 0 ok, 1 runtime error (no daemon, permission, RPC failure), 2 usage error (bad
option values, also when the daemon reports INVALID_ARGUMENT for them). Read commands
take ``--json`` (schemas in render.py); ``--watch``/``top`` print one JSON document per line.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import time
from typing import Any, Callable, NoReturn, Optional

import typer
from rich.console import Console, Group

from vtalloc.allocator.config import BACKENDS, Config, parse_size
from vtalloc.allocator.errors import InvalidArgumentError, VtallocError

from . import render
from .layout import natural_width

__all__ = ["register", "Backend"]

# --backend's choices: argument parsing refuses others (exit code 2).
Backend = enum.Enum("Backend", {b: b for b in BACKENDS}, type=str)  # type: ignore[misc]


class PagesFormat(str, enum.Enum):
    table = "table"
    json = "json"
    torch = "torch"

_SOCKET_HELP = "The daemon's socket (unix:///path or a path). Default: $VTALLOC_SOCKET, else vtalloc.sock " \
               "in $XDG_RUNTIME_DIR/vtalloc, /run/vtalloc (root) or /tmp/vtalloc-<uid>. Clients use it only if " \
               "its directory, the sockets and the daemon are their own uid's, root's or a uid in " \
               "$VTALLOC_DAEMON_UIDS."


def register(app: typer.Typer, *, fail: Callable[[str, int], NoReturn], console: Console,
             err_console: Console, is_debug: Callable[[], bool]) -> None:
    """Add the service commands to ``app``."""

    def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
        """Errors become one line on stderr and an exit code (tracebacks with --debug)."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (typer.Exit, typer.Abort, typer.BadParameter):
                raise
            except InvalidArgumentError as e:
                if is_debug():
                    raise
                fail(str(e), 2)
            except (VtallocError, OSError) as e:
                if is_debug():
                    raise
                fail(str(e), 1)

        return wrapper

    def open_session(socket: Optional[str], timeout: float):
        from .session import ServiceSession

        return ServiceSession(socket, kind="observer", timeout_s=timeout)

    def emit_json(doc: dict[str, Any]) -> None:
        print(json.dumps(doc, separators=(",", ":")), flush=True)

    def show(tables: list[Any], wide: bool) -> None:
        """Print tables at the terminal's width (columns that do not fit go to further blocks),
        or with ``wide`` one block each, as wide as it needs."""
        out = console
        if wide:
            out = Console(width=max([console.width, *(natural_width(t) for t in tables)]), file=console.file,
                          force_terminal=console.is_terminal, no_color=console.no_color)
        for n, t in enumerate(tables):
            if n:
                out.print()
            out.print(t)

    def width(wide: bool) -> Optional[int]:
        return None if wide else console.width

    socket_opt = typer.Option(None, "--socket", envvar="VTALLOC_SOCKET", help=_SOCKET_HELP)
    wide_opt = typer.Option(False, "--wide", help="One line per row, however wide (default: fit the terminal, "
                            "moving columns that do not fit to a further block of rows).")
    timeout_opt = typer.Option(5.0, "--timeout", min=0.1, help="Seconds to wait for each answer from the daemon.")

    # -- serve ------------------------------------------------------------------------------
    @app.command()
    def serve(
        socket: Optional[str] = socket_opt,
        backend: Backend = typer.Option("auto", help="auto (cuda if usable, else host), host (memfd pages, no GPU) "
                                        "or cuda."),
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
                                                "hello yet; one more is refused with LimitExceededError."),
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
                    err_console.print(line, highlight=False, soft_wrap=True)

        try:
            run_daemon(config, log_level=log_level, then=note)
        except InvalidArgumentError as e:  # an option the backend judged (page size, capacity, quotas)
            if is_debug():
                raise
            fail(str(e), 2)
        except (VtallocError, OSError) as e:  # the socket directory, another daemon, the backend: runtime
            if is_debug():
                raise
            fail(str(e), 1)

    # -- stats and top ----------------------------------------------------------------------
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

    @app.command()
    @guard
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
                    show(render.proc_tables(doc, width(wide)), wide)
            return
        with open_session(socket, timeout) as session:
            for doc in samples(lambda: node_stats(session, session_id), watch, count):
                if json_out:
                    emit_json(doc)
                else:
                    if watch:
                        console.rule(time.strftime("%H:%M:%S"))
                    show(render.stats_tables(doc, width(wide)), wide)

    @app.command()
    @guard
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

            if not console.is_terminal:
                for n, doc in enumerate(docs):
                    if n:
                        console.print()
                    console.rule(head(), align="left")
                    show(render.stats_tables(doc, width(wide)), wide)
                    console.file.flush()
                return
            with Live(console=console, auto_refresh=False) as live:
                try:
                    for doc in docs:
                        live.update(Group(head() + "  (Ctrl-C to quit)", *render.stats_tables(doc, width(wide))),
                                    refresh=True)
                except KeyboardInterrupt:
                    pass

    # -- pages and plot ---------------------------------------------------------------------
    def page_map(socket: Optional[str], timeout: float, session_id: str) -> dict[str, Any]:
        from vtalloc.server.proto.vtalloc.v1 import pages_pb2

        with open_session(socket, timeout) as session:
            return render.pages_doc(session.call(session.pages, "ListPages",
                                                 pages_pb2.ListPagesRequest(session_id=session_id)))

    @app.command()
    @guard
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
            console.print(f"wrote {out}: {len(snapshot['segments'])} segments (torch.cuda._memory_viz)")
            return
        if json_out or fmt is PagesFormat.json:
            emit_json(doc)
            return
        show(render.pages_tables(doc, width(wide)), wide)

    @app.command()
    @guard
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
            console.print(f"wrote {out}: {drawn['cells']} cells, {len(drawn['sessions'])} sessions")

    # -- quotas and forced eviction ---------------------------------------------------------
    quota_app = typer.Typer(help="Read or set per-principal quotas (setting needs an admin uid).",
                            no_args_is_help=True, rich_markup_mode=app.rich_markup_mode)
    app.add_typer(quota_app, name="quota")

    @quota_app.command("get")
    @guard
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
            show(render.quota_tables(doc, width(wide)), wide)

    @quota_app.command("set")
    @guard
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
            show(render.quota_tables(doc, width(wide)), wide)

    @app.command()
    @guard
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
            console.print(f"session {session_id}: asked {r.asked} pages, {r.returned} given back"
                          + (", missed the deadline" if r.missed else "") + (", killed" if r.killed else ""))

    # -- health -----------------------------------------------------------------------------
    @app.command()
    @guard
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
            console.print(f"[{style}]{status}[/] {UNIX_SCHEME}{path}" + (f"  ({side_error})" if side_error else ""))
        if status != "SERVING":
            raise typer.Exit(1)
