"""Space names: AddressSpace(name=...), its validation and default, and what `vtalloc stats --pid` shows."""

from __future__ import annotations

import json
import os
import re

import pytest
from helpers.service import Daemon, wait_until
from helpers.spaces import MiB, host_space
from typer.testing import CliRunner

from vtalloc.allocator import InvalidArgumentError, global_counters
from vtalloc.allocator.publish import publish_stats, read_published, unpublish_stats
from vtalloc.client import ServiceAddressSpace
from vtalloc.client.cli import app


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("VTALLOC_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.delenv("VTALLOC_PUBLISH_STATS", raising=False)
    return tmp_path / "rt"


def published_names(pid: int, want: set[str]) -> list[str] | None:
    try:
        names = [row["name"] for row in read_published(pid)["spaces"]]
    except FileNotFoundError:
        return None
    return names if set(names) == want else None


@pytest.mark.parametrize("name", ["encoder", "torch:cuda:0", "team.a/run-7@node1+x", "A" * 64, "0"])
def test_a_good_name_is_kept_and_shown_by_repr(name):
    with host_space(8 * MiB, name=name) as space:
        assert space.name == name and repr(name) in repr(space)


@pytest.mark.parametrize("name", ["", "A" * 65, "two words", "-dash-first", "tab\there", "mine#1", "café",
                                  "new\nline", 7, b"bytes"])
def test_a_bad_name_is_a_typed_error_and_creates_nothing(name):
    before = global_counters()
    with pytest.raises(InvalidArgumentError) as e:
        host_space(8 * MiB, name=name)
    assert isinstance(e.value, ValueError) and "name" in str(e.value)
    assert global_counters() == before


def test_unnamed_spaces_say_backend_device_and_their_order():
    with host_space(8 * MiB) as a, host_space(8 * MiB) as b:
        ma, mb = (re.fullmatch(r"host:0#(\d+)", s.name) for s in (a, b))
        assert ma and mb and int(mb.group(1)) == int(ma.group(1)) + 1


def test_stats_pid_lists_spaces_by_name(runtime):
    with host_space(8 * MiB, name="encoder") as enc, host_space(8 * MiB) as anon:
        publish_stats(enc, interval_s=0.02)
        publish_stats(anon, interval_s=0.02)
        wait_until(lambda: published_names(os.getpid(), {"encoder", anon.name}), 5)
        r = CliRunner().invoke(app, ["stats", "--pid", str(os.getpid()), "--json"])
        assert r.exit_code == 0, r.output
        assert {row["name"] for row in json.loads(r.stdout)["spaces"]} == {"encoder", anon.name}
        table = CliRunner().invoke(app, ["stats", "--pid", str(os.getpid())], env={"COLUMNS": "200"})
        assert table.exit_code == 0 and "encoder" in table.stdout and anon.name in table.stdout
        with pytest.raises(InvalidArgumentError):
            publish_stats(enc, name="bad name")
        publish_stats(enc, name="decoder", interval_s=0.02)  # publishing under another name renames the row
        wait_until(lambda: published_names(os.getpid(), {"decoder", anon.name}), 5)
        unpublish_stats(enc)
        unpublish_stats(anon)


def test_a_service_space_is_named_for_its_session(tmp_path):
    with Daemon(capacity="16MiB") as d:
        with ServiceAddressSpace(d.address, lease_batch_pages=1) as space:
            assert space.name == f"session-{space.session.session_id}"
        with ServiceAddressSpace(d.address, lease_batch_pages=1, name="decoder") as space:
            assert space.name == "decoder"
        with pytest.raises(InvalidArgumentError):
            ServiceAddressSpace(d.address, name="no spaces please")
