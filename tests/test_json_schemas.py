"""Every JSON document the CLI prints matches its published schema (schemas/*.schema.json),
and the schemas are strict: a missing or renamed key fails.

The documents are the real output of the commands, against a real daemon with a client holding
pages (not hand-made dicts); docs/service.md names each schema file.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re

import pytest

# The test extra installs jsonschema; a GPU image with the extra only in part (2026-11-28) must
# still collect the rest of the suite (gpu_session.py runs `-m gpu` over every file).
pytest.importorskip("jsonschema", reason="jsonschema (the test extra) is not installed")

from helpers.schemas import SCHEMA_DIR, file_for, load, schema_files, validate
from helpers.service import ClientProc, Daemon, wait_until
from helpers.spaces import PAGE
from jsonschema import Draft202012Validator, ValidationError
from typer.testing import CliRunner

from vtalloc.client.cli import app

runner = CliRunner()


def cli(d: Daemon | None, *args: str) -> list[dict]:
    r = runner.invoke(app, list(args), env={"VTALLOC_SOCKET": d.socket} if d else {})
    assert r.exit_code == 0, (args, r.exit_code, r.stdout, r.stderr)
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """Each service command's --json output, with a client that has reported (so no key is
    missing for lack of a report) and one forced eviction."""
    out: dict[str, list[dict]] = {}
    plot_png = tmp_path_factory.mktemp("plot") / "map.png"
    with Daemon(capacity="64MiB", args=("--metrics-port", "0")) as d, ClientProc() as c:
        out["ready"] = [d.ready]
        sid = c.ok("open", address=d.address, batch=1, keep_free=64)["session_id"]
        c.ok("malloc", nbytes=3 * PAGE, seed=1)
        c.ok("free", addr=c.ok("malloc", nbytes=2 * PAGE, seed=2)["addr"])

        def reported():
            doc = cli(d, "stats", "--json")[0]
            return all(s["reported"] for s in doc["sessions"]) and doc
        out["stats"] = [wait_until(reported, 10, interval_s=0.05)]
        out["stats --watch"] = cli(d, "stats", "--json", "--watch", "0.05", "--count", "2")
        out["top --json"] = cli(d, "top", "--json", "--count", "1")
        out["pages"] = cli(d, "pages", "--json")
        out["quota get"] = cli(d, "quota", "get", "--json")
        out["quota set"] = cli(d, "quota", "set", "uid:0", "--min", "0", "--max", "64MiB", "--json")
        out["health"] = cli(d, "health", "--json")
        out["plot"] = cli(d, "plot", "--out", str(plot_png), "--json")
        out["evict"] = cli(d, "evict", sid, "--pages", "1", "--timeout", "10", "--json")
    out["info"] = cli(None, "info", "--json")
    return out


COMMANDS = ["ready", "stats", "stats --watch", "top --json", "pages", "quota get", "quota set", "health", "plot",
            "evict", "info"]


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_prints_what_its_schema_says(docs, command):
    assert docs[command], f"{command} printed no JSON document"
    for doc in docs[command]:
        validate(doc, "serve-ready.schema.json" if command == "ready" else None)


def test_the_daemon_documents_carry_a_session_that_reported(docs):
    """So the report keys (cached_bytes, ooms_total, ...) were really checked, not only declared."""
    s = docs["stats"][0]["sessions"]
    assert s and all(x["reported"] for x in s)
    assert docs["ready"][0]["metrics"].startswith("http://")


@pytest.mark.parametrize("args", [("--steps", "1"), ("--no-train",)])
def test_demo_document(args):
    validate(cli(None, "demo", "--backend", "host", "--json", *args)[-1])


def test_proc_stats_document(tmp_path, monkeypatch):
    """This process publishes one space's stats; ``stats --pid`` reads them back without a daemon."""
    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.publish import publish_stats, unpublish_stats

    monkeypatch.setenv("VTALLOC_RUNTIME_DIR", str(tmp_path / "rt"))
    with AddressSpace(backend="host", capacity="16MiB") as space:
        space.malloc(3 << 20)
        publish_stats(space, name="schema-test", interval_s=0.05)
        try:
            def published():
                r = runner.invoke(app, ["stats", "--pid", str(os.getpid()), "--json"])
                return r.exit_code == 0 and json.loads(r.stdout)
            doc = wait_until(published, 10, interval_s=0.05)
        finally:
            unpublish_stats(space)
    validate(doc)
    assert doc["spaces"][0]["stats"]["allocated_bytes"] == 3 << 20


# -- strictness ------------------------------------------------------------------------------
def _paths(doc, prefix=()):
    """(path, key) of every key of every object in ``doc`` (first element of each list)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix, k
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list) and doc:
        yield from _paths(doc[0], prefix + (0,))


def _at(doc, path):
    for p in path:
        doc = doc[p]
    return doc


@pytest.mark.parametrize("command", ["stats", "pages", "health", "evict", "quota get", "info", "ready"])
def test_a_missing_or_renamed_key_fails(docs, command):
    base = docs[command][0]
    name = "serve-ready.schema.json" if command == "ready" else file_for(base["schema"])
    open_maps = {("health", "services")}  # gRPC service names: any key
    checked = 0
    for path, key in _paths(base):
        if (command, path[-1] if path else "") in open_maps:
            continue
        for change in ("drop", "rename"):
            doc = copy.deepcopy(base)
            parent = _at(doc, path)
            value = parent.pop(key)
            if change == "rename":
                parent[key + "_renamed"] = value
            with pytest.raises(ValidationError):
                validate(doc, name)
            checked += 1
    assert checked > 10 or command in ("evict", "quota get", "info")


def test_the_keys_the_issue_named_are_required(docs):
    stats = load("stats.schema.json")
    assert {"time_unix", "daemon", "observers"} <= set(stats["required"])
    session = stats["properties"]["sessions"]["items"]
    device = stats["properties"]["devices"]["items"]
    assert {"cached_bytes", "ooms_total"} <= set(session["required"])
    assert {"inherited_pages", "inherited_bytes", "inherited_processes"} <= set(device["required"])


# -- the schemas against what the documents are made from ---------------------------------------
def test_space_stats_schema_is_the_stats_dataclass():
    from vtalloc.allocator.stats import Stats

    schema = load("space-stats.schema.json")
    assert set(schema["properties"]) == set(schema["required"]) == {f.name for f in dataclasses.fields(Stats)}


def test_counters_schema_is_the_proto_message():
    from vtalloc.server.proto.vtalloc.v1 import pages_pb2

    counters = load("stats.schema.json")["properties"]["counters"]
    assert set(counters["required"]) == {f.name for f in pages_pb2.Counters.DESCRIPTOR.fields}


def test_info_device_schema_is_the_device_info_dataclass():
    from vtalloc.allocator.device_info import DeviceInfo

    dev = load("info.schema.json")["properties"]["cuda_device_0"]["oneOf"][1]
    assert set(dev["required"]) == {f.name for f in dataclasses.fields(DeviceInfo)}


@pytest.mark.parametrize("path", schema_files(), ids=lambda p: p.name)
def test_schema_is_valid_and_named_in_the_docs(path):
    Draft202012Validator.check_schema(json.loads(path.read_text()))
    service_md = (SCHEMA_DIR.parent / "docs" / "service.md").read_text()
    assert f"schemas/{path.name}" in service_md, f"docs/service.md does not point at schemas/{path.name}"


def test_every_document_name_in_the_cli_has_a_schema():
    client = SCHEMA_DIR.parent / "client"
    names = set()
    for py in client.glob("*.py"):
        names |= set(re.findall(r"\"(vtalloc\.[a-z-]+/v\d+)\"", py.read_text()))
    assert names, "no document names found in client/"
    for name in sorted(names):
        f = SCHEMA_DIR / file_for(name)
        assert f.exists(), f"{name} has no schema ({f.name})"
        assert load(f.name)["properties"]["schema"] == {"const": name}
