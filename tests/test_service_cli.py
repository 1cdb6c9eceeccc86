"""The service commands of `vtalloc`, checked through their --json documents and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.service import ClientProc, Daemon, child_env, wait_until
from helpers.spaces import MiB, PAGE
from typer.testing import CliRunner

from vtalloc.client.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def node():
    """A daemon and one client holding 3 live pages and 2 spare ones."""
    with Daemon(capacity="64MiB") as d, ClientProc() as c:
        sid = c.ok("open", address=d.address, batch=1, keep_free=64)["session_id"]
        c.ok("malloc", nbytes=3 * PAGE, seed=1)
        c.ok("free", addr=c.ok("malloc", nbytes=2 * PAGE, seed=2)["addr"])
        yield d, c, sid


def cli(d: Daemon | None, *args: str, code: int = 0) -> list[dict]:
    env = {"VTALLOC_SOCKET": d.socket} if d else {}
    r = runner.invoke(app, list(args), env=env)
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def reported(d: Daemon, sid: str) -> dict:
    def ready():
        doc = cli(d, "stats", "--json")[0]
        s = [x for x in doc["sessions"] if x["session_id"] == sid]
        return s and s[0]["reported"] and s[0]["resident_pages"] == 3 and doc
    return wait_until(ready, 5, interval_s=0.05)


def test_stats_json_per_device_and_per_session(node):
    d, c, sid = node
    doc = reported(d, sid)
    assert doc["schema"] == "vtalloc.stats/v1" and doc["admin_view"]
    dev = doc["devices"][0]
    assert (dev["backend"], dev["page_bytes"], dev["capacity_pages"]) == ("host", PAGE, 32)
    assert dev["leased_pages"] == 5 and dev["free_pages"] == 27 and dev["free_bytes"] == 27 * PAGE
    s = next(x for x in doc["sessions"] if x["session_id"] == sid)
    assert s["pid"] == c.pid and s["principal"] == "uid:0"
    assert (s["leased_pages"], s["resident_pages"], s["cached_pages"], s["unmapped_pages"]) == (5, 3, 2, 0)
    assert s["leased_bytes"] == 5 * PAGE and s["quota"]["max_bytes"] == 64 * MiB
    assert 0 < s["fragmentation"] < 1 and s["evicted_pages"] == 0 and s["evictions_per_s"] == 0
    assert doc["counters"]["leases_total"] >= 1 and "reclaims_total" in doc["counters"]
    only = cli(d, "stats", "--session", sid, "--json")[0]
    assert [x["session_id"] for x in only["sessions"]] == [sid]


def test_stats_watch_prints_one_document_per_sample(node):
    d, _, _ = node
    docs = cli(d, "stats", "--watch", "0.05", "--count", "3", "--json")
    assert len(docs) == 3 and docs[0]["time_unix"] < docs[1]["time_unix"] < docs[2]["time_unix"]
    assert len(cli(d, "top", "--interval", "0.05", "--count", "2", "--json")) == 2
    cli(d, "top", "--interval", "0.05", "--count", "1")  # the live view renders and ends


def test_pages_json_is_the_page_map(node):
    d, _, sid = node
    doc = cli(d, "pages", "--json")[0]
    assert doc["schema"] == "vtalloc.pages/v1" and doc["hidden_pages"] == 0
    mine = [p for p in doc["pages"] if p["session_id"] == sid]
    assert len(mine) == 5 and {p["state"] for p in mine} == {"leased"}
    assert len({p["page_id"] for p in doc["pages"]}) == len(doc["pages"])
    reported(d, sid)
    mine = [p for p in cli(d, "pages", "--json")[0]["pages"] if p["session_id"] == sid]
    # Page by page, as the client reported them: 3 under the live allocation, 2 cached.
    assert sorted(p["use"] for p in mine) == ["cached", "cached", "resident", "resident", "resident"]
    assert cli(d, "pages", "--session", sid, "--json")[0]["sessions"][0]["session_id"] == sid
    cli(d, "pages", "--session", "nope", code=1)


def test_plot_writes_a_png_of_the_page_map(node, tmp_path):
    d, _, sid = node
    reported(d, sid)
    out = tmp_path / "map.png"
    doc = cli(d, "plot", "--out", str(out), "--json")[0]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert doc["schema"] == "vtalloc.plot/v1" and doc["cells"] == 32 and doc["sessions"] == [sid]
    cli(d, "plot", "--out", str(tmp_path / "map.jpg"), code=2)


def test_quota_get_and_set(node):
    d, _, _ = node
    doc = cli(d, "quota", "get", "--json")[0]
    assert doc["schema"] == "vtalloc.quota/v1" and doc["quotas"][0]["principal"] == "uid:0"
    assert doc["default"] == {"min_bytes": 0, "max_bytes": 64 * MiB}
    set_ = cli(d, "quota", "set", "team-x", "--min", "4MiB", "--max", "16MiB", "--json")[0]
    assert set_["quotas"] == [{"principal": "team-x", "min_bytes": 4 * MiB, "max_bytes": 16 * MiB}]
    assert {q["principal"] for q in cli(d, "quota", "get", "--all", "--json")[0]["quotas"]} >= {"team-x"}
    cli(d, "quota", "set", "team-x", "--min", "8MiB", "--max", "4MiB", code=2)      # min > max
    cli(d, "quota", "set", "team-x", "--min", "1GiB", "--max", "2GiB", code=2)      # minimums past capacity
    cli(d, "quota", "set", "bad name", "--min", "0", "--max", "4MiB", code=2)


def test_evict_asks_a_session_for_pages(node):
    d, c, sid = node
    doc = cli(d, "evict", sid, "--pages", "1", "--json")[0]
    assert doc == {"schema": "vtalloc.evict/v1", "session_id": sid, "asked": 1, "returned": 1, "missed": False,
                   "killed": False}
    cli(d, "evict", "nope", code=1)


def test_health(node, tmp_path):
    d, _, _ = node
    doc = cli(d, "health", "--json")[0]
    assert doc["status"] == "SERVING" and doc["side_channel"] and doc["services"]["vtalloc.v1.Pages"] == "SERVING"
    doc = cli(None, "health", "--socket", str(tmp_path / "none.sock"), "--json", code=1)[0]
    assert doc["status"] == "UNREACHABLE" and not doc["side_channel"]


def test_without_a_daemon_commands_fail_with_exit_1(tmp_path):
    for args in (["stats"], ["pages"], ["top", "--count", "1"], ["quota", "get"]):
        cli(None, *args, "--socket", str(tmp_path / "none.sock"), code=1)


def test_usage_errors_exit_2(tmp_path):
    sock = str(tmp_path / "s" / "v.sock")
    for args in (["serve", "--socket", sock, "--capacity", "banana"], ["serve", "--socket", sock, "--quota", "x"],
                 ["serve", "--socket", sock, "--evict-deadline", "0"], ["serve", "--socket", sock, "--principal", "a"],
                 ["stats", "--count", "0"], ["stats", "--bogus"]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.stdout, r.stderr)


@pytest.mark.parametrize("args, says", [
    (["--page-size", "1000"], "not a multiple of the host granularity"),           # the backend judges it
    (["--capacity", "1"], "at least one page"),
    (["--group", "nosuch-vt"], "no group 'nosuch-vt'"),
    (["--admin-uid", "-1"], "--admin-uid: -1 is not a uid"),
    (["--admin-uid", "99999999999"], "--admin-uid: 99999999999 is not a uid"),
    (["--quota", "uid:7=0:1GiB", "--quota", "uid:7=0:2GiB"], "uid:7 is given more than once"),
    (["--capacity", "64MiB", "--default-quota", "128MiB:1GiB"], "the default quota's minimum"),
    (["--capacity", "64MiB", "--quota", "uid:7=128MiB:1GiB"], "quota minimums would add up"),
])
def test_every_bad_serve_option_is_a_usage_error_that_touches_nothing(tmp_path, args, says):
    # Issue 23, item 9: these exited 1 or were accepted; the socket directory is not even made.
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "vtalloc.client.cli", "serve", "--backend", "host", "--socket",
                        str(run / "v.sock"), *args], capture_output=True, text=True, timeout=60, env=child_env())
    assert r.returncode == 2 and says in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr and not run.exists()


def test_stats_of_a_process_without_a_daemon(tmp_path, monkeypatch):
    runtime = tmp_path / "rt"
    monkeypatch.setenv("VTALLOC_RUNTIME_DIR", str(runtime))
    program = textwrap.dedent("""
        import sys
        from vtalloc.allocator import AddressSpace
        space = AddressSpace(backend="host", capacity="16MiB")
        space.malloc(3 << 20)
        print("ready", flush=True)
        sys.stdin.read()
        space.close()
    """)
    env = child_env(VTALLOC_RUNTIME_DIR=str(runtime), VTALLOC_PUBLISH_STATS="0.05")
    with subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, env=env) as p:
        assert p.stdout.readline().strip() == "ready"

        def published():
            r = runner.invoke(app, ["stats", "--pid", str(p.pid), "--json"])
            return r.exit_code == 0 and json.loads(r.stdout)
        doc = wait_until(published, 5, interval_s=0.05)
        assert doc["schema"] == "vtalloc.proc-stats/v1" and doc["pid"] == p.pid and doc["alive"]
        st = doc["spaces"][0]["stats"]
        assert st["allocated_bytes"] == 3 << 20 and st["capacity_bytes"] == 16 << 20
        assert runner.invoke(app, ["stats", "--pid", str(p.pid)]).exit_code == 0  # the table
        p.stdin.close()
        p.wait(10)
    r = runner.invoke(app, ["stats", "--pid", str(p.pid), "--json"])
    assert r.exit_code == 1 and "publishes no vtalloc stats" in r.stderr.replace("\n", " ")
    assert not os.path.exists(runtime / "proc" / f"{p.pid}.json")
