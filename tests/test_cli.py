"""The `vtalloc` command line as a user meets it: tables that fit 80 columns (a pipe) without
losing a column, `top` in a pipe, one table of exit codes, --version, --debug anywhere, sizes.

Each command is rendered at 80 and at 200 columns (COLUMNS, as in a pipe or a wide terminal):
no line may be wider, and every column of every table must be there (at 80 some move to a
"(continued)" block or to name/value pairs; at 200 each table is one block).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time

import pytest
from helpers.service import ClientProc, Daemon, child_env, short_dir, wait_until
from helpers.sizes import MiB, PAGE
from typer.testing import CliRunner

from vtalloc.allocator import InvalidArgumentError, parse_size
from vtalloc.client.cli import app, main

runner = CliRunner()

# Every column header each table has (render.py): all must be printed at any width.
STATS_HEADERS = ("device", "capacity", "leased", "free", "inherited", "evicted", "delivering", "frag",
                 "session", "pid", "principal", "resident", "cached", "quota", "ev/s", "rs/s", "misses",
                 "leases", "pages leased", "returned", "quota refusals", "evict requests", "kills", "reclaims",
                 "reclaimed pages")
PAGES_HEADERS = ("session", "principal", "pid", "pages", "delivering", "resident", "cached", "unmapped", "evicted",
                 "page ids")
PROC_HEADERS = ("space", "backend", "capacity", "allocated", "active", "mapped", "cached", "pages", "frag", "allocs",
                "OOMs", "driver calls")


@pytest.fixture(scope="module")
def node():
    """A daemon and a client holding 3 live pages, 2 cached ones, and publishing its stats."""
    runtime = short_dir()
    with Daemon(capacity="64MiB") as d, \
            ClientProc(env={"VTALLOC_PUBLISH_STATS": "0.05", "VTALLOC_RUNTIME_DIR": str(runtime)}) as c:
        sid = c.ok("open", address=d.address, batch=1, keep_free=64)["session_id"]
        c.ok("malloc", nbytes=3 * PAGE, seed=1)
        c.ok("free", addr=c.ok("malloc", nbytes=2 * PAGE, seed=2)["addr"])

        def reported():
            doc = json.loads(run(d, 80, "stats", "--json").stdout)
            return any(s["reported"] and s["resident_pages"] == 3 for s in doc["sessions"])
        wait_until(reported, 10, interval_s=0.05)
        yield d, c, sid, runtime


def run(d: Daemon | None, columns: int, *args: str, code: int = 0, **env: str):
    env = {"COLUMNS": str(columns), **({"VTALLOC_SOCKET": d.socket} if d else {}), **env}
    r = runner.invoke(app, list(args), env=env)
    assert r.exit_code == code, (args, r.exit_code, r.stdout, r.stderr)
    return r


def check_fits(out: str, columns: int, headers: tuple[str, ...]) -> None:
    lines = out.splitlines()
    assert lines, "nothing printed"
    too_wide = [line for line in lines if len(line.rstrip()) > columns]
    assert not too_wide, f"lines wider than {columns}:\n" + "\n".join(too_wide)
    missing = [h for h in headers if h not in out]
    assert not missing, f"columns not shown at {columns}: {missing}\n{out}"


@pytest.mark.parametrize("columns", [80, 200])
@pytest.mark.parametrize("args,headers", [
    (("stats",), STATS_HEADERS), (("stats", "--wide"), STATS_HEADERS), (("top", "--count", "1"), STATS_HEADERS),
    (("pages",), PAGES_HEADERS), (("quota", "get"), ("principal", "min (guaranteed)", "max (hard)", "(default)")),
    (("health",), ("SERVING",)), (("info",), ("backend", "available", "reason", "host")),
    (("demo", "--backend", "host", "--no-train"), ("stat", "before the big allocation", "after", "num_page_reclaims")),
])
def test_every_command_fits_the_width_and_shows_every_column(node, columns, args, headers):
    d, _, sid, _ = node
    r = run(d, columns, *args)
    if "--wide" in args:  # one line per row however wide: only the columns are checked
        assert all(h in r.stdout for h in headers)
        assert any(sid in line and "0 B/64 MiB" in line and "%" in line for line in r.stdout.splitlines())
        return
    check_fits(r.stdout, columns, headers)
    if args[0] in ("stats", "top", "pages"):
        assert sid in r.stdout
    if columns == 200 and args[0] == "stats":  # wide enough: one block, the session on one line
        assert "(continued)" not in r.stdout
        assert any(sid in line and "0 B/64 MiB" in line for line in r.stdout.splitlines())
    if columns == 80 and args[0] == "stats":  # too narrow for the sessions: a second block, said so
        assert "sessions (continued)" in r.stdout and "--wide" in r.stdout
        assert sum(sid in line for line in r.stdout.splitlines()) == 2


@pytest.mark.parametrize("columns", [80, 200])
def test_stats_of_a_process_fits(node, columns):
    _, c, _, runtime = node
    r = wait_until(lambda: (x := runner.invoke(app, ["stats", "--pid", str(c.pid)],
                                               env={"COLUMNS": str(columns), "VTALLOC_RUNTIME_DIR": str(runtime)}))
                   .exit_code == 0 and x, 10, interval_s=0.05)
    check_fits(r.stdout, columns, PROC_HEADERS)
    assert "driver calls" in r.stdout and "map " in r.stdout


def test_pages_in_torch_format_render_in_memory_viz(node, tmp_path):
    """`vtalloc pages --format torch --out F`: the daemon's page map as PyTorch's snapshot; the
    client holds 3 resident pages and 2 cached ones (the fixture)."""
    import pickle

    memory_viz = pytest.importorskip("torch.cuda._memory_viz")
    d, _, sid, _ = node
    out = tmp_path / "pages.pickle"
    r = run(d, 80, "pages", "--format", "torch", "--out", str(out))
    assert "wrote" in r.stdout
    snap = pickle.loads(out.read_bytes())
    mine = [s for s in snap["segments"] if s["vtalloc_session"] == sid]
    blocks = [b for s in mine for b in s["blocks"]]
    assert sum(b["state"] == "active_allocated" for b in blocks) == 3 and len(blocks) >= 5
    assert all(b["size"] == PAGE for b in blocks)
    assert f"segments: {len(snap['segments'])}" in memory_viz.segsum(snap)
    assert "active_allocated" in memory_viz.segments(snap, format_flamegraph=lambda lines: lines)
    run(d, 80, "pages", "--format", "torch", code=2)  # no --out: a usage error
    run(d, 80, "pages", "--out", str(out), code=2)


def test_top_in_a_pipe_prints_a_snapshot_per_interval(node):
    """Not on a terminal (a pipe, `timeout`), top prints each refresh below the last, flushed."""
    d, _, sid, _ = node
    cmd = [sys.executable, "-c", "from vtalloc.client.cli import main; main()", "top", "--interval", "0.5"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=child_env(VTALLOC_SOCKET=d.socket, COLUMNS="80")) as p:
        try:
            got, heads, end = [], 0, time.monotonic() + 20
            with selectors.DefaultSelector() as sel:
                sel.register(p.stdout, selectors.EVENT_READ)
                while heads < 3 and time.monotonic() < end:  # the third head: two whole snapshots before it
                    if sel.select(1.0):
                        line = p.stdout.readline()
                        if not line:
                            break
                        got.append(line)
                        heads += line.startswith("vtalloc top")
            assert heads == 3, ("".join(got), p.poll())
            out = "".join(got)
            assert p.poll() is None  # still running: what we read was flushed, not written at exit
            assert out.count(sid) >= 4 and out.count("reclaimed pages") == 2
            assert all(len(line.rstrip("\n")) <= 80 for line in got)
        finally:
            p.terminate()
            p.wait(10)
            p.stderr.read()


# -- exit codes, --version, --debug ---------------------------------------------------------------
def exit_code(*args: str) -> int:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return e.value.code


@pytest.mark.parametrize("args,code", [
    (("info",), 0),
    (("--version",), 0),
    (("stats", "--socket", "/nonexistent/v.sock"), 1),            # no daemon: a runtime failure
    (("health", "--socket", "/nonexistent/v.sock"), 1),
    (("demo", "--backend", "gpu"), 2),                              # not a choice
    (("serve", "--backend", "gpu"), 2),
    (("demo", "--backend", "host", "--capacity", "64mb"), 2),      # an ambiguous size
    (("demo", "--backend", "host", "--capacity", "banana"), 2),
    (("serve", "--capacity", "banana"), 2),
    (("stats", "--count", "0"), 2),
    (("stats", "--bogus"), 2),
    (("nosuchcommand",), 2),
])
def test_exit_codes(args, code, capsys):
    assert exit_code(*args) == code, capsys.readouterr()
    err = capsys.readouterr().err
    if code == 2 and "64mb" in args:
        assert "64MiB" in err and "64MB" in err


def test_no_gpu_is_a_runtime_failure(capsys):
    from vtalloc.allocator import backend_available

    if backend_available("cuda")[0]:
        pytest.skip("a CUDA device is here")
    assert exit_code("demo", "--backend", "cuda", "--no-train") == 1
    assert "vtalloc info" in capsys.readouterr().err


def test_version(capsys):
    from importlib.metadata import version

    assert exit_code("--version") == 0
    assert capsys.readouterr().out.strip() == f"vtalloc {version('vtalloc')}"


def test_debug_works_before_and_after_the_command(capsys):
    from vtalloc.server.errors import ServiceUnavailableError

    assert exit_code("stats", "--socket", "/nonexistent/v.sock") == 1
    for args in (["--debug", "stats", "--socket", "/nonexistent/v.sock"],
                 ["stats", "--socket", "/nonexistent/v.sock", "--debug"],
                 ["quota", "get", "--debug", "--socket", "/nonexistent/v.sock"]):
        with pytest.raises(ServiceUnavailableError):  # --debug: the traceback, not a one-line error
            main(args)


def _commands(group, path=()):
    for name, cmd in group.commands.items():
        yield (*path, name), cmd
        if hasattr(cmd, "commands"):  # a group (typer's click, vendored or not)
            yield from _commands(cmd, (*path, name))


@pytest.mark.parametrize("columns", [80, 200])
def test_every_commands_help_shows_every_option_name_whole(columns):
    """rich's option table cut names at 80 columns ("--max-concurrent-rp…"): every option of
    every command must appear whole, on lines no wider than the terminal."""
    import typer.main

    for path, cmd in _commands(typer.main.get_command(app)):
        out = run(None, columns, *path, "--help").stdout
        check_fits(out, columns, tuple(o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")))
        assert "…" not in out, (path, out)


def test_help_lists_the_exit_codes():
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "Exit codes: 0 ok; 1 runtime failure" in r.stdout


# -- sizes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("64MiB", 64 * MiB), ("64mib", 64 * MiB), ("64MIB", 64 * MiB), ("64m", 64 * MiB), ("64M", 64 * MiB),
    ("64MB", 64 * 10**6), ("64kB", 64_000), ("64KB", 64_000), ("2GB", 2 * 10**9), ("1TB", 10**12),
    ("3gib", 3 << 30), ("512b", 512), ("512B", 512),
])
def test_sizes_mean_what_they_say(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["64mb", "64Mb", "64mB", "2gb", "1kb", "1tb", "1.5gb"])
def test_ambiguous_sizes_are_refused_with_both_spellings(text):
    with pytest.raises(InvalidArgumentError, match="ambiguous") as e:
        parse_size(text)
    number, prefix = text.rstrip("bBmMgGkKtT"), text.rstrip("bB")[-1].upper()
    assert f"{number}{prefix}iB" in str(e.value) and f"{number}{prefix}B" in str(e.value)


def test_a_rounded_capacity_is_said_on_stderr(capsys):
    assert exit_code("demo", "--backend", "host", "--capacity", "63MiB", "--no-train", "--json") == 0
    out, err = capsys.readouterr()
    assert "--capacity 63MiB" in err and "rounded down to 62 MiB" in err and "31 pages" in err
    assert json.loads(out)["defrag"]["capacity_bytes"] == 62 * MiB
    assert exit_code("demo", "--backend", "host", "--capacity", "64MiB", "--no-train", "--json") == 0
    assert "warning" not in capsys.readouterr().err


def test_serve_says_when_it_rounds_the_capacity():
    base = short_dir()
    sock = str(base / "run" / "v.sock")
    cmd = [sys.executable, "-c", "from vtalloc.client.cli import main; main()", "serve", "--backend", "host",
           "--capacity", "3MiB", "--socket", sock]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()) as p:
        try:
            ready = json.loads(p.stdout.readline())
            assert ready["capacity_bytes"] == 2 * MiB
            err = wait_until(lambda: (line := p.stderr.readline()) and "warning" in line and line, 10)
            assert "--capacity 3MiB" in err and "rounded down to 2 MiB" in err
        finally:
            p.terminate()
            p.wait(10)
    assert os.path.isdir(base)
