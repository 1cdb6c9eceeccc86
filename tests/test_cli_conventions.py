"""The `vtalloc` command as a shell user meets it: user-given text is printed as it is (never read
as rich markup), errors name what the user gave, Ctrl-C exits 130 and a closed pipe exits 141
quietly from every command, and the tables explain themselves (docs/service.md, "Exit codes").

Each test is one finding of issue 39, run as a user runs it: the CLI in its own process.
"""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.service import ClientProc, Daemon, short_dir, wait_until
from helpers.spaces import PAGE

from vtalloc.client import render

VTALLOC = [sys.executable, "-m", "vtalloc"]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*VTALLOC, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, **kw)


def flat(text: str) -> str:
    """Rich wraps long lines at 80 columns: compare with the wrapping undone."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def node():
    with Daemon(capacity="32MiB") as d, ClientProc() as c:
        c.ok("open", address=d.address, batch=1)
        c.ok("malloc", nbytes=2 * PAGE, seed=1)
        yield d


def test_a_socket_path_with_brackets_is_printed_as_given():
    """It died with a rich.errors.MarkupError traceback ('[/x]' closes no tag)."""
    r = run("stats", "--socket", "/tmp/nope/[/x].sock")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "MarkupError" not in r.stderr
    assert "no vtalloc daemon answers at /tmp/nope/[/x].sock" in flat(r.stderr)


def test_a_missing_daemon_is_named_by_the_socket_the_user_gave(tmp_path):
    """The error named the side channel (…/vtalloc.fd.sock), a file the user never gave."""
    sock = str(short_dir() / "none.sock")
    r = run("stats", "--socket", sock)
    assert r.returncode == 1
    err = flat(r.stderr)
    assert f"no vtalloc daemon answers at {sock} " in err and ".fd.sock" not in err


def test_an_extra_in_brackets_survives_in_the_message(node):
    """`vtalloc plot` without matplotlib said `pip install 'vtalloc'`: markup ate '[plot]'."""
    code = textwrap.dedent("""
        import importlib.abc, sys
        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "matplotlib":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NotInstalled())
        from vtalloc.client.cli import main
        main(sys.argv[1:])
    """)
    r = subprocess.run([sys.executable, "-c", code, "plot", "--out", str(short_dir() / "m.png")],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "VTALLOC_SOCKET": node.socket})
    assert r.returncode == 1, r.stderr
    assert "pip install 'vtalloc[plot]'" in flat(r.stderr)


def test_a_session_name_with_markup_is_printed_as_it_is():
    doc = {"devices": [{"backend": "host", "device": 0, "capacity_pages": 4, "capacity_bytes": 4 * PAGE,
                        "page_bytes": PAGE, "free_pages": 4}],
           "sessions": [{"session_id": "[bold]s1[/]", "principal": "pod:[red]x", "pid": 7, "reported": True,
                         "resident_pages": 0, "cached_pages": 0, "unmapped_pages": 0, "evicted_pages": 0, "paused_bytes": 0}],
           "pages": [], "hidden_pages": 0}
    from rich.console import Console

    out = Console(record=True, width=200, file=io.StringIO())
    for t in render.pages_tables(doc, 200):
        out.print(t)
    text = out.export_text()
    assert "[bold]s1[/]" in text and "pod:[red]x" in text


@pytest.mark.parametrize("command", [["info", "--json"], ["plot", "--json", "--out", "PNG"], ["stats", "--json"],
                                     ["pages", "--json"]])
def test_a_closed_pipe_ends_quietly_with_141(node, command, tmp_path):
    """`vtalloc plot ... --json | head -c1` printed 'error: [Errno 32] Broken pipe' and exited 1."""
    args = [str(tmp_path / "m.png") if a == "PNG" else a for a in command]
    reader, writer = os.pipe()
    os.close(reader)   # head -c1 has read its byte and gone before the command writes (deterministic)
    proc = subprocess.Popen([*VTALLOC, *args], stdout=writer, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "VTALLOC_SOCKET": node.socket})
    os.close(writer)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err
    assert err == "", err


def _interrupt(args: list[str], env: dict[str, str], *, tty: bool, ready: str) -> tuple[int, str]:
    """Start the command, wait for ``ready`` in its output, send SIGINT (Ctrl-C), return (rc, output)."""
    if tty:
        master, slave = pty.openpty()
        proc = subprocess.Popen([*VTALLOC, *args], stdout=slave, stderr=slave, env={**os.environ, **env})
        os.close(slave)
        out = b""

        def seen() -> bool:
            nonlocal out
            try:
                out += os.read(master, 65536)
            except OSError:
                pass
            return ready.encode() in out
        try:
            wait_until(seen, 60, interval_s=0.05)
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(60)
        finally:
            os.close(master)
        return rc, out.decode(errors="replace")
    log = short_dir() / "out.txt"
    with open(log, "w") as f:
        proc = subprocess.Popen([*VTALLOC, *args], stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env})
        wait_until(lambda: ready in log.read_text(), 60, interval_s=0.05)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(60)
    return rc, log.read_text()


def test_ctrl_c_exits_130_from_top_on_a_terminal(node):
    """top caught the KeyboardInterrupt and exited 0 (stats --watch exited 130: they disagreed)."""
    rc, out = _interrupt(["top", "--interval", "0.2"], {"VTALLOC_SOCKET": node.socket}, tty=True, ready="Ctrl-C to quit")
    assert rc == 130, out[-2000:]


@pytest.mark.parametrize("args,ready", [(["top", "--interval", "0.2"], "vtalloc top"),
                                        (["stats", "--watch", "0.2"], "vtalloc node")])
def test_ctrl_c_exits_130_from_the_watching_commands(node, args, ready):
    rc, out = _interrupt(args, {"VTALLOC_SOCKET": node.socket}, tty=False, ready=ready)
    assert rc == 130, out[-2000:]
    assert "Traceback" not in out


def test_ctrl_c_stops_serve_cleanly_and_exits_130_but_sigterm_exits_0():
    """serve stopped cleanly on Ctrl-C and exited 0; a service manager's SIGTERM still exits 0."""
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        base = short_dir()
        log = base / "out.txt"
        sock = str(base / "run" / "vtalloc.sock")   # a directory the daemon makes (private)
        with open(log, "w") as f:
            proc = subprocess.Popen([*VTALLOC, "serve", "--socket", sock, "--backend", "host", "--capacity", "16MiB"],
                                    stdout=f, stderr=subprocess.STDOUT)
            try:
                wait_until(lambda: '"event": "ready"' in log.read_text(), 60, interval_s=0.05)
            except TimeoutError:
                proc.kill()
                raise AssertionError(log.read_text()[-2000:]) from None
            proc.send_signal(sig)
            assert proc.wait(60) == code, log.read_text()[-2000:]
        assert "stopping" in log.read_text() and not os.path.exists(sock)  # the orderly stop, sockets removed


def test_question_marks_in_stats_say_what_they_mean(node):
    """The README's service example showed '?' in the stats columns with nothing saying why."""
    doc = json.loads(run("stats", "--json", env={"VTALLOC_SOCKET": node.socket}).stdout)
    doc["sessions"][0]["reported"] = False   # as right after a client's first lease
    text = "\n".join(_text(t) for t in render.stats_tables(doc, 80))
    assert "?" in text and render.NOT_REPORTED.split(".")[0] in flat(text)
    doc["sessions"][0]["reported"] = True
    assert render.NOT_REPORTED.split(".")[0] not in flat("\n".join(_text(t) for t in render.stats_tables(doc, 80)))


def test_an_empty_page_map_is_one_table_saying_so():
    """An empty `pages` printed an empty "(continued)" table after an empty first one."""
    doc = {"devices": [{"backend": "host", "device": 0, "capacity_pages": 512, "capacity_bytes": 512 * PAGE,
                        "page_bytes": PAGE, "free_pages": 512}], "sessions": [], "pages": [], "hidden_pages": 0}
    tables = render.pages_tables(doc, 80)
    text = "\n".join(_text(t, 80) for t in tables)
    assert len(tables) == 1 and "(continued)" not in text and "no session holds a page" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def _text(table, width: int = 200) -> str:
    from rich.console import Console

    c = Console(record=True, width=width, file=io.StringIO())
    c.print(table)
    return c.export_text()


def test_the_help_lists_the_exit_codes():
    r = run("--help")
    assert r.returncode == 0 and "130 interrupted (Ctrl-C)" in flat(r.stdout) and "141" in r.stdout
