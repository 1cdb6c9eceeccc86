"""The stats publisher: what `vtalloc stats --pid` reads for a process that uses vtalloc without a daemon."""

from __future__ import annotations

import os
import stat

import pytest
from helpers.service import wait_until
from helpers.spaces import MiB, host_space

from vtalloc.allocator import InvalidArgumentError
from vtalloc.allocator.publish import publish_stats, read_published, record_path, unpublish_stats


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("VTALLOC_RUNTIME_DIR", str(tmp_path / "rt"))
    monkeypatch.delenv("VTALLOC_PUBLISH_STATS", raising=False)
    return tmp_path / "rt"


def fresh_record(pid: int, allocated: int):
    try:
        r = read_published(pid)
    except FileNotFoundError:
        return None
    return r if r["spaces"] and r["spaces"][0]["stats"]["allocated_bytes"] == allocated else None


def test_published_stats_follow_the_space_and_vanish_with_it(runtime):
    space = host_space(16 * MiB)
    try:
        publish_stats(space, name="train", interval_s=0.02)
        a = space.malloc(3 * MiB)
        r = wait_until(lambda: fresh_record(os.getpid(), 3 * MiB), 5)
        row = r["spaces"][0]
        assert r["schema"] == "vtalloc.proc/v1" and r["pid"] == os.getpid()
        assert row["name"] == "train" and row["backend"] == "host"
        assert row["stats"]["pages_mapped"] == space.stats().pages_mapped
        assert 0.0 <= row["stats"]["fragmentation"] < 1.0
        assert stat.S_IMODE(os.stat(record_path(os.getpid())).st_mode) == 0o600
        space.free(a)
        wait_until(lambda: fresh_record(os.getpid(), 0), 5)
    finally:
        space.close()
    wait_until(lambda: not record_path(os.getpid()).exists(), 5)


def test_unpublishing_removes_the_record(runtime):
    with host_space(8 * MiB) as space:
        publish_stats(space, interval_s=0.02)
        wait_until(lambda: record_path(os.getpid()).exists(), 5)
        unpublish_stats(space)
        wait_until(lambda: not record_path(os.getpid()).exists(), 5)


def test_the_environment_turns_publishing_on_and_bad_values_are_refused(runtime, monkeypatch):
    monkeypatch.setenv("VTALLOC_PUBLISH_STATS", "0.02")
    with host_space(8 * MiB) as space:
        space.malloc(4096)
        wait_until(lambda: fresh_record(os.getpid(), 4096), 5)
    wait_until(lambda: not record_path(os.getpid()).exists(), 5)
    monkeypatch.setenv("VTALLOC_PUBLISH_STATS", "sometimes")
    with pytest.raises(InvalidArgumentError):
        host_space(8 * MiB)
    with pytest.raises(InvalidArgumentError):
        publish_stats(object(), interval_s=0)
