"""Real daemons and real client processes for the service tests (never mocks).

``Daemon`` runs ``vtalloc serve`` (host backend) in its own process group and waits for its
ready line; ``ClientProc`` runs tests/helpers/service_client.py, a client driven by JSON
commands, optionally as another uid. Both are context managers that always stop what they
started (SIGTERM, then SIGKILL) and close every pipe, so no test leaks a process or a
ResourceWarning. ``short_dir()`` makes a socket directory short enough for AF_UNIX paths
and traversable by other uids (the daemon creates its own 0750 directory inside).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
CLIENT_SCRIPT = HERE / "service_client.py"
NOBODY = 65534
NOGROUP = 65534


def short_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="vt", dir="/tmp"))
    os.chmod(d, 0o755)
    return d


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VTALLOC_", "XDG_RUNTIME_DIR"))}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", HOME="/tmp")
    env.update(extra)
    return env


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    """One line of the child's stdout, or TimeoutError / EOFError."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            raise TimeoutError(f"no answer from pid {proc.pid} within {timeout_s} s")
    line = proc.stdout.readline()
    if not line:
        raise EOFError(f"pid {proc.pid} closed its stdout (exit code {proc.poll()})")
    return line


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


# `vtalloc serve` as another uid: import what the daemon uses first (as a ClientProc does), then drop.
_SERVE_AS = """
import asyncio, grp, json, logging, os, pwd, signal, sys
import grpc, grpc_health.v1.health, grpc_reflection.v1alpha.reflection
import vtalloc.client.cli as cli, vtalloc.server.daemon, vtalloc.server.limits, vtalloc.server.quota
import vtalloc.server.protocol.address, vtalloc.server.state_keeper, zoneinfo, email.parser, importlib.metadata
import contextlib, io
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main(["serve", "--help"])  # the imports of parsing the options
uid, gid = (int(x) for x in sys.argv[1].split(":"))
os.setgroups([]); os.setgid(gid); os.setuid(uid)
cli.main(sys.argv[2:])
"""


class Daemon:
    """``vtalloc serve --backend host`` on ``<base>/run/vtalloc.sock``."""

    def __init__(self, base: Path | None = None, *, capacity: str = "64MiB", args: tuple[str, ...] = (),
                 evict_deadline: float = 1.0, env: dict[str, str] | None = None, nofile: int | None = None,
                 user: int | None = None, group: int | None = None,
                 preexec: Callable[[], None] | None = None) -> None:
        self.env = env or {}
        self.preexec = preexec  # run in the daemon's process before exec (e.g. enter a cgroup namespace)
        self.nofile = nofile  # RLIMIT_NOFILE (soft and hard) of the daemon process, or inherited
        self.user, self.group = user, group  # run the daemon as this uid and gid (the test must be root)
        self.base = base or short_dir()
        self._own_base = base is None
        self.socket = str(self.base / "run" / "vtalloc.sock")
        self.address = "unix://" + self.socket
        self.capacity = capacity
        self.args = args
        self.evict_deadline = evict_deadline
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}
        self.stderr_path = self.base / f"daemon-{time.monotonic_ns()}.log"

    def start(self) -> "Daemon":
        args = ["serve", "--socket", self.socket, "--backend", "host", "--capacity", self.capacity,
                "--evict-deadline", str(self.evict_deadline), *self.args]
        cmd = [sys.executable, "-m", "vtalloc.client.cli", *args]
        if self.user is not None:  # the interpreter may be unreadable to that uid: start as root, then drop
            cmd = [sys.executable, "-c", _SERVE_AS, f"{self.user}:{self.group if self.group is not None else self.user}",
                   *args]
        self._log = open(self.stderr_path, "w")
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
                                         text=True, start_new_session=True, env=child_env(**self.env),
                                         preexec_fn=None if self.nofile is None and self.preexec is None
                                         else self._before_exec)
        except BaseException:
            self._log.close()
            raise
        try:
            self.ready = json.loads(_readline(self.proc, 30))
        except (TimeoutError, EOFError, ValueError):
            self.stop()
            raise RuntimeError(f"the daemon did not start:\n{self.log()}") from None
        return self

    def _before_exec(self) -> None:  # in the child, before exec
        import resource

        if self.nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        if self.preexec is not None:
            self.preexec()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.stderr_path.read_text()
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        _stop(self.proc, sig)
        self._log.close()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def kill9(self) -> None:
        self.stop(signal.SIGKILL)

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._own_base:
            shutil.rmtree(self.base, ignore_errors=True)


class ClientProc:
    """A client process driven by JSON commands (see service_client.py)."""

    def __init__(self, *, user: int | None = None, group: int | None = None, env: dict[str, str] | None = None,
                 cwd: str = "/") -> None:
        cmd = [sys.executable, str(CLIENT_SCRIPT)]
        if user is not None:  # the child drops to this uid itself, after its imports
            cmd += ["--drop-to", f"{user}:{group if group is not None else user}"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=cwd, start_new_session=True, env=child_env(**(env or {})))
        self.pid = self.proc.pid

    def send(self, op: str, **args: Any) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout_s: float = 30.0) -> dict[str, Any]:
        try:
            return json.loads(_readline(self.proc, timeout_s))
        except (EOFError, TimeoutError) as e:
            raise RuntimeError(f"{e}; client stderr:\n{self.stderr_now()}") from None

    def call(self, op: str, timeout_s: float = 30.0, **args: Any) -> dict[str, Any]:
        self.send(op, **args)
        return self.recv(timeout_s)

    def ok(self, op: str, **args: Any) -> dict[str, Any]:
        r = self.call(op, **args)
        assert r.get("ok"), f"{op} failed: {r}\n{self.stderr_now()}"
        return r

    def stderr_now(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read()

    def kill9(self) -> float:
        """SIGKILL the client's process group; returns the monotonic time it was reaped."""
        os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()
        return time.monotonic()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _stop(self.proc, signal.SIGKILL)

    def __enter__(self) -> "ClientProc":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.01) -> Any:
    """Poll ``predicate`` until it returns something true; that value, or TimeoutError."""
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


class Observer:
    """An observer session in the test process, to read the daemon's stats (root: sees everything)."""

    def __init__(self, address: str, **kwargs: Any) -> None:
        from vtalloc.client.session import ServiceSession

        self.session = ServiceSession(address, kind="observer", timeout_s=5.0, **kwargs)

    def stats(self) -> Any:
        from vtalloc.server.proto.vtalloc.v1 import pages_pb2

        return self.session.call(self.session.pages, "GetStats", pages_pb2.GetStatsRequest())

    def session_ids(self) -> set[str]:
        return {s.info.session_id for s in self.stats().sessions}

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
