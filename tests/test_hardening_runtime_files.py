"""Issue 38, item 1: runtime files are reached through held, checked directory descriptors, and
``vtalloc stats --pid`` trusts nothing it reads (allocator/runtime_dir.py, Note [Held directory
descriptors]; allocator/publish.py, Note [Reading a record]).

The invariant tested: no file under a directory another user can write is opened by name after
a check; nothing is followed through a link; a record is read bounded and checked before a byte
of it reaches a terminal. Every test here failed on the code before the fix: the other user's
rename exchange overwrote the victim's file with a stats record; a planted ``<pid>.tmp`` link
was followed; a directory open to others, or a link, was published into; the CLI read
``/dev/zero`` until its memory ran out, blocked on a FIFO, printed a forged record's escape
sequences, and accepted a record in another user's directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.service import child_env, short_dir, wait_until
from helpers.spaces import MiB, host_space
from helpers.users import made_users, needs_users, run_as

from vtalloc.allocator import InvalidArgumentError
from vtalloc.allocator.publish import MAX_RECORD_BYTES, SCHEMA, publish_stats, read_published, unpublish_stats

VICTIM = """
import logging, os, sys, time
logging.basicConfig()
from vtalloc.allocator import AddressSpace
from vtalloc.allocator.publish import publish_stats
space = AddressSpace(backend="host", capacity="16MiB")
publish_stats(space, interval_s=0.01)
print(os.getpid(), flush=True)
time.sleep(float(sys.argv[1]))
space.close()
"""

# Swap the victim's proc/ for our own, whose <pid>.tmp links to the target, as fast as we can.
EXCHANGER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
rt, pid, target, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
proc, evil = os.path.join(rt, "proc").encode(), os.path.join(rt, "evil").encode()
os.mkdir(evil)
end = time.monotonic() + seconds
swaps = 0
while time.monotonic() < end:
    try:
        os.symlink(target, os.path.join(evil, f"{pid}.tmp".encode()))
    except OSError:
        pass
    if libc.renameat2(-100, proc, -100, evil, 2) == 0:   # RENAME_EXCHANGE
        swaps += 1
        time.sleep(0.0003)
        libc.renameat2(-100, proc, -100, evil, 2)
print(swaps, flush=True)
"""


@needs_users
def test_another_user_cannot_make_the_publisher_write_through_its_directory():
    """The issue's attack: the other user made /tmp/vtalloc-<uid> first (here the temporary
    directory is a sticky 1777 one of the test's, as /tmp is) and exchanges the victim's proc/
    with its own, holding <pid>.tmp as a link to a file the victim owns."""
    base = short_dir()
    os.chmod(base, 0o1777)
    try:
        with made_users(2) as (victim, attacker):
            runtime = base / f"vtalloc-{victim.uid}"
            runtime.mkdir(mode=0o777)                   # the attacker's, made first, open to the victim
            os.chown(runtime, attacker.uid, attacker.gid)
            os.chmod(runtime, 0o777)
            target = base / "precious"
            target.write_text("the victim's own data\n")
            os.chown(target, victim.uid, victim.gid)
            os.chmod(target, 0o600)
            env = {"TMPDIR": str(base)}
            with run_as(victim, VICTIM, "6", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True) as v:
                pid = v.stdout.readline().strip()
                with run_as(attacker, EXCHANGER, str(runtime), pid, str(target), "5", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) as x:
                    swaps, err = x.communicate(timeout=60)
                _, verr = v.communicate(timeout=60)
            assert x.returncode == 0, err
            assert target.read_text() == "the victim's own data\n"
            assert not (runtime / "proc" / f"{pid}.json").exists()   # nothing published in another's directory
            assert "not published" in verr and f"uid {attacker.uid}" in verr, verr
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    rt = tmp_path / "rt"
    monkeypatch.setenv("VTALLOC_RUNTIME_DIR", str(rt))
    monkeypatch.delenv("VTALLOC_PUBLISH_STATS", raising=False)
    return rt


def my_record():
    try:
        return read_published(os.getpid())["spaces"]
    except FileNotFoundError:
        return None


def published_once(space) -> None:
    publish_stats(space, interval_s=0.01)
    try:
        time.sleep(0.3)
    finally:
        unpublish_stats(space)


def test_a_planted_link_in_the_publishers_own_directory_is_never_followed(runtime):
    (runtime / "proc").mkdir(parents=True, mode=0o700)
    runtime.chmod(0o700)
    target = runtime.parent / "target"
    target.write_text("keep")
    os.symlink(target, runtime / "proc" / f"{os.getpid()}.tmp")
    with host_space(8 * MiB) as space:
        publish_stats(space, interval_s=0.01)
        try:
            wait_until(my_record, 5)
        finally:
            unpublish_stats(space)
    assert target.read_text() == "keep"


@pytest.mark.parametrize("case", ["open to others", "a link", "proc open to others", "proc a link"])
def test_the_publisher_refuses_a_directory_others_can_change(runtime, case, caplog):
    elsewhere = runtime.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if case == "a link":
        runtime.symlink_to(elsewhere)
    else:
        runtime.mkdir(mode=0o700)
        if case == "open to others":
            runtime.chmod(0o777)
        elif case == "proc open to others":
            (runtime / "proc").mkdir()
            (runtime / "proc").chmod(0o777)
        else:
            (runtime / "proc").symlink_to(elsewhere)
    with host_space(8 * MiB) as space:
        published_once(space)
    assert list(elsewhere.iterdir()) == []
    if case.startswith("proc"):
        assert not list((runtime / "proc").iterdir()) if (runtime / "proc").is_dir() else True
    else:
        assert not (runtime / "proc").exists() or not any((runtime / "proc").iterdir())
    assert "not published" in caplog.text


def stats_cli(pid: int, runtime: Path) -> subprocess.CompletedProcess:
    """``vtalloc stats --pid`` in a child limited to 1 GiB of address space and 60 s."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    return subprocess.run([sys.executable, "-m", "vtalloc.client.cli", "stats", "--pid", str(pid)],
                          env=child_env(VTALLOC_RUNTIME_DIR=str(runtime), COLUMNS="200"), capture_output=True,
                          text=True, timeout=60, preexec_fn=limit)


def record(pid: int, uid: int, name: str = "train") -> dict:
    with host_space(8 * MiB) as space:
        stats = {**space.stats().as_dict(), "fragmentation": 0.0}
    return {"schema": SCHEMA, "pid": pid, "uid": uid, "updated_unix": time.time(), "interval_s": 1.0,
            "spaces": [{"name": name, "backend": "host", "device": 0, "leased": False, "service": None,
                        "stats": stats}]}


def plant(runtime: Path, pid: int, what: str) -> None:
    proc = runtime / "proc"
    proc.mkdir(parents=True, mode=0o700)
    path = proc / f"{pid}.json"
    if what == "/dev/zero":
        os.symlink("/dev/zero", path)
    elif what == "fifo":
        os.mkfifo(path, 0o600)
    elif what == "huge":
        with open(path, "w") as f:
            f.write('{"schema": "vtalloc.proc/v1", "pad": "' + "x" * (MAX_RECORD_BYTES + 10) + '"}')
    elif what == "escapes":
        path.write_text(json.dumps(record(pid, os.geteuid(), name="\x1b]2;pwned\x07\x1b[31mtrain")))
    elif what == "another pid":
        path.write_text(json.dumps(record(pid + 1, os.geteuid())))
    elif what == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    os.chmod(proc.parent, 0o700)


@pytest.mark.parametrize("what", ["/dev/zero", "fifo", "huge", "escapes", "another pid", "deep"])
def test_stats_pid_refuses_what_it_cannot_trust_with_a_message(tmp_path, what):
    runtime = tmp_path / "rt"
    pid = os.getpid()
    plant(runtime, pid, what)
    r = stats_cli(pid, runtime)
    assert r.returncode == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "\x1b" not in r.stdout + r.stderr
    assert f"cannot read the stats of process {pid}" in r.stderr


def test_stats_pid_reads_a_good_record(tmp_path):
    runtime = tmp_path / "rt"
    plant(runtime, os.getpid(), "")
    (runtime / "proc" / f"{os.getpid()}.json").write_text(json.dumps(record(os.getpid(), os.geteuid())))
    r = stats_cli(os.getpid(), runtime)
    assert r.returncode == 0, r.stderr
    assert "train" in r.stdout


@needs_users
def test_stats_pid_refuses_a_record_in_another_users_directory(tmp_path, monkeypatch):
    """The reader (root here) trusts directories of its own uid, root's, or the uid the process
    runs as; this process is root's, so a record kept by another uid is not its record."""
    runtime = tmp_path / "rt"
    pid = os.getpid()
    plant(runtime, pid, "")
    path = runtime / "proc" / f"{pid}.json"
    with made_users(1) as (other,):
        path.write_text(json.dumps(record(pid, other.uid)))
        for p in (runtime, runtime / "proc", path):
            os.chown(p, other.uid, other.gid)
        os.chmod(tmp_path, 0o755)
        r = stats_cli(pid, runtime)
        assert r.returncode == 1 and f"belongs to uid {other.uid}" in r.stderr, r.stderr
        monkeypatch.setenv("VTALLOC_RUNTIME_DIR", str(runtime))
        with pytest.raises(InvalidArgumentError):
            read_published(pid)


def test_a_record_is_checked_whole():
    from vtalloc.allocator.publish import check_record

    good = record(7, 1000)
    assert check_record(good, 7, 1000)["spaces"][0] == good["spaces"][0]
    for bad in ({**good, "pid": 8}, {**good, "uid": 0}, {**good, "spaces": "x"}, {**good, "updated_unix": "now"},
                {**good, "spaces": [{**good["spaces"][0], "backend": "tpu"}]},
                {**good, "spaces": [{**good["spaces"][0], "service": "\x1b[2J"}]},
                {**good, "spaces": [{**good["spaces"][0], "stats": {**good["spaces"][0]["stats"], "capacity_bytes": -1}}]},
                {**good, "spaces": [{**good["spaces"][0], "stats": {"capacity_bytes": 1}}]},   # fields missing
                {**good, "spaces": [{**good["spaces"][0], "name": "a\nb"}]}):
        with pytest.raises(InvalidArgumentError):
            check_record(bad, 7, 1000)
    stats = good["spaces"][0]["stats"]
    extra = {**good, "spaces": [{**good["spaces"][0], "stats": {**stats, "a_future_field": 3}}]}
    assert check_record(extra, 7, 1000)["spaces"][0]["stats"] == stats


def test_a_forked_child_does_not_keep_the_parents_directory(runtime):
    with host_space(8 * MiB) as space:
        publish_stats(space, interval_s=0.01)
        try:
            wait_until(my_record, 5)
            proc_dir = os.stat(runtime / "proc")
            r, w = os.pipe()
            child = os.fork()
            if child == 0:  # the child lists its descriptors: none may be the parent's proc/
                os.close(r)
                held = 0
                for fd in os.listdir("/proc/self/fd"):
                    with contextlib.suppress(OSError):
                        st = os.stat(int(fd))
                        held += (st.st_ino, st.st_dev) == (proc_dir.st_ino, proc_dir.st_dev)
                os.write(w, str(held).encode())
                os._exit(0)
            os.close(w)
            with os.fdopen(r) as f:
                assert f.read() == "0"
            os.waitpid(child, 0)
        finally:
            unpublish_stats(space)
    assert stat.S_ISDIR(proc_dir.st_mode)


def _calls(path: Path, names: set[str]):
    import ast

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
            yield node, ast.unparse(node)


def test_no_product_open_follows_a_link_and_the_publisher_names_nothing_by_path():
    """The invariant, in the source: every os.open of the package passes O_NOFOLLOW (DIR_FLAGS
    includes it), and the publisher opens, creates, renames and removes only relative to a held
    directory descriptor (dir_fd)."""
    root = Path(__file__).resolve().parent.parent
    files = [p for d in ("allocator", "server", "client") for p in (root / d).rglob("*.py") if "proto" not in p.parts]
    opens = [(p.name, text) for p in files for _, text in _calls(p, {"open"})]
    assert opens, "no os.open found: the check reads nothing"
    assert [o for o in opens if "O_NOFOLLOW" not in o[1] and "DIR_FLAGS" not in o[1]] == []
    by_path = [text for node, text in _calls(root / "allocator" / "publish.py", {"open", "replace", "unlink", "mkdir",
                                                                                 "rename", "remove", "stat", "lstat"})
               if not any(k.arg in ("dir_fd", "src_dir_fd") for k in node.keywords) and "/proc/" not in text]
    assert by_path == []
