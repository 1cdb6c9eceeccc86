"""Trust at the rendezvous (issue 23, items 1 and 8): a client uses only a socket directory, sockets
and a daemon of its own uid, root's or a uid it names ($VTALLOC_DAEMON_UIDS), and checks them
before it sends a byte; the daemon uses an existing directory only as it is.

Other uids (ATTACKER has no passwd entry: root may run processes as any uid) need root; those
tests skip otherwise. Each attack is made against a real daemon (or a fake listener, to see that
nothing was sent), so the old client, which checked nothing, would have leased from it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.service import NOBODY, NOGROUP, ClientProc, Daemon, Observer, child_env, short_dir
from helpers.spaces import PAGE

from vtalloc.client.session import ServiceSession
from vtalloc.server.protocol.errors import ServiceUnavailableError, UntrustedRendezvousError
from vtalloc.server.protocol.rendezvous import DAEMON_UIDS_ENV

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="other uids' directories, sockets and daemons need root")
ATTACKER = 64999  # a uid of nobody on this machine: what another user would be


@pytest.fixture(scope="module")
def daemon():
    with Daemon(capacity="16MiB") as d:
        yield d


def open_session(address: str, **kwargs) -> ServiceSession:
    return ServiceSession(address, kind="observer", timeout_s=3.0, **kwargs)


@pytest.fixture
def run_dir():
    """``<base>/run``, not made yet (each test makes it as the case needs); removed after."""
    base = short_dir()
    yield base / "run"
    shutil.rmtree(base)


def make_dir(path: Path, mode: int, uid: int = 0, gid: int = 0) -> Path:
    os.mkdir(path)
    if (uid, gid) != (0, 0):
        os.chown(path, uid, gid)
    os.chmod(path, mode)
    return path


@needs_root
def test_a_daemon_of_another_user_in_the_default_directory_is_refused(run_dir):
    # Item 1: another user made the victim's default socket directory first and serves in it.
    run = make_dir(run_dir, 0o750, uid=ATTACKER, gid=NOGROUP)  # the victim (nobody, nogroup) may enter
    env = {"VTALLOC_RUNTIME_DIR": str(run)}  # the default directory, as $XDG_RUNTIME_DIR or /tmp would give
    with Daemon(run.parent, capacity="16MiB", user=ATTACKER, group=NOGROUP) as d:
        with ClientProc(user=NOBODY, group=NOGROUP, env=env) as victim:
            r = victim.call("open", address=None)
            assert not r["ok"] and r["error"] == "UntrustedRendezvousError", r
            assert f"belongs to uid {ATTACKER}" in r["message"] and str(run) in r["message"]
        with Observer(d.address, daemon_uids=(ATTACKER,)) as obs:  # root names the uid: trusted
            assert obs.stats().counters.sessions_total == 0  # the victim never opened a session
        # The same client, told to trust that uid, uses the daemon: the refusal was the check.
        with ClientProc(user=NOBODY, group=NOGROUP, env={**env, DAEMON_UIDS_ENV: str(ATTACKER)}) as c:
            c.ok("open", address=None, batch=1)
            assert c.ok("malloc", nbytes=PAGE, seed=1)["addr"]  # leased from that daemon
            c.ok("close")


FAKE_LISTENER = textwrap.dedent("""
    import json, os, socket, sys
    control, side, foreign, uid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    g = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); g.bind(control)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(side)
    # SO_PEERCRED names who called listen(): the foreign one listens after the uid is dropped.
    first, second = (g, s) if foreign == "side" else (s, g)
    first.listen(8)
    os.setgroups([]); os.setgid(65534); os.setuid(uid)
    second.listen(8)
    print("ready", flush=True)
    s.settimeout(20)
    conn, _ = s.accept()
    conn.settimeout(10)
    try:
        data = conn.recv(8192)
    except OSError as e:
        data = repr(e).encode()
    print(json.dumps({"received": data.decode(errors="replace")}), flush=True)
""")


@needs_root
@pytest.mark.parametrize("foreign", ["side", "grpc"])
def test_a_daemon_whose_peer_uid_is_foreign_is_refused_before_anything_is_sent(tmp_path, foreign):
    # The directory and both socket files are root's, but the process behind one socket is not.
    run = tmp_path / "run"
    os.mkdir(run, 0o750)
    control, side = run / "vtalloc.sock", run / "vtalloc.fd.sock"
    fake = subprocess.Popen([sys.executable, "-c", FAKE_LISTENER, str(control), str(side), foreign, str(ATTACKER)],
                            stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert fake.stdout.readline().strip() == "ready"
        with pytest.raises(UntrustedRendezvousError) as e:
            open_session(str(control))
        where = side if foreign == "side" else control
        assert f"serving {where}" in str(e.value) and f"runs as uid {ATTACKER}" in str(e.value)
        out = json.loads(fake.stdout.readline())
        assert out == {"received": ""}  # the client hung up without a hello
    finally:
        fake.kill()
        fake.wait()
        fake.stdout.close()


def test_a_socket_directory_writable_by_others_is_refused(daemon):
    run = os.path.dirname(daemon.socket)
    open_session(daemon.address).close()  # fine as the daemon made it
    os.chmod(run, 0o777)
    try:
        with pytest.raises(UntrustedRendezvousError, match="mode 0777: writable by group and others"):
            open_session(daemon.address)
    finally:
        os.chmod(run, 0o750)


def test_a_symlinked_socket_directory_is_refused(daemon, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(os.path.dirname(daemon.socket))
    with pytest.raises(UntrustedRendezvousError, match="is a symbolic link"):
        open_session(str(link / "vtalloc.sock"))


def test_symlinked_sockets_are_refused(daemon, tmp_path):
    run = tmp_path / "run"
    os.mkdir(run, 0o750)
    (run / "vtalloc.sock").symlink_to(daemon.socket)
    (run / "vtalloc.fd.sock").symlink_to(daemon.ready["side_channel"])
    with pytest.raises(UntrustedRendezvousError, match=r"vtalloc\.sock is a symbolic link"):
        open_session(str(run / "vtalloc.sock"))      # the socket given is checked first, then its side channel
    (run / "vtalloc.sock").unlink()
    os.link(daemon.socket, run / "vtalloc.sock")     # the daemon's own socket (a hard link is the socket)
    with pytest.raises(UntrustedRendezvousError, match=r"vtalloc\.fd\.sock is a symbolic link"):
        open_session(str(run / "vtalloc.sock"))


def test_an_ancestor_others_may_write_is_refused(daemon):
    # Others could rename the socket directory away and put theirs in its place (no sticky bit).
    base = os.path.dirname(os.path.dirname(daemon.socket))
    os.chmod(base, 0o777)
    try:
        with pytest.raises(UntrustedRendezvousError, match=f"{base}, above the socket directory .* mode 0777"):
            open_session(daemon.address)
        os.chmod(base, 0o1777)  # sticky, as /tmp: others may not rename what is not theirs
        open_session(daemon.address).close()
    finally:
        os.chmod(base, 0o755)


@needs_root
@pytest.mark.parametrize("what", ["directory", "socket"])
def test_a_directory_or_socket_of_another_uid_is_refused_unless_named(daemon, monkeypatch, what):
    path = os.path.dirname(daemon.socket) if what == "directory" else daemon.ready["side_channel"]
    os.chown(path, ATTACKER, -1)
    try:
        with pytest.raises(UntrustedRendezvousError, match=f"belongs to uid {ATTACKER}, not to a trusted uid 0"):
            open_session(daemon.address)
        monkeypatch.setenv(DAEMON_UIDS_ENV, f"{ATTACKER}")
        open_session(daemon.address).close()
    finally:
        os.chown(path, 0, -1)


def test_a_bad_daemon_uids_variable_is_a_usage_error(daemon, monkeypatch):
    from vtalloc.allocator.errors import InvalidArgumentError

    monkeypatch.setenv(DAEMON_UIDS_ENV, "nosuchuser-vt")
    with pytest.raises(InvalidArgumentError, match="neither a uid nor a user name"):
        open_session(daemon.address)


def test_a_missing_socket_is_still_unavailable(tmp_path):
    os.chmod(tmp_path, 0o700)
    with pytest.raises(ServiceUnavailableError):
        open_session(str(tmp_path / "none.sock"))


def test_health_checks_the_rendezvous_before_asking(daemon):
    run = os.path.dirname(daemon.socket)
    os.chmod(run, 0o770)
    try:
        r = subprocess.run([sys.executable, "-m", "vtalloc.client.cli", "health", "--json", "--socket", daemon.socket],
                           capture_output=True, text=True, timeout=60, env=child_env())
    finally:
        os.chmod(run, 0o750)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["status"] == "UNREACHABLE" and "writable by group" in doc["error"]


# -- the daemon's side (items 1 and 8) ------------------------------------------------------------

def serve(sock: Path, *args: str) -> subprocess.CompletedProcess:
    """``vtalloc serve`` that must refuse to start (a timeout means it served)."""
    return subprocess.run([sys.executable, "-m", "vtalloc.client.cli", "serve", "--backend", "host",
                           "--capacity", "16MiB", "--socket", str(sock), *args],
                          capture_output=True, text=True, timeout=60, env=child_env())


def said(r: subprocess.CompletedProcess) -> str:
    """stderr as one line (the console wraps it at 80 columns)."""
    return " ".join(r.stderr.split())


def _mode_and_group(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return stat.S_IMODE(st.st_mode), st.st_gid


@needs_root
@pytest.mark.parametrize("mode, gid, why", [
    (0o700, NOGROUP, "members of --group nogroup cannot enter it"),  # private: never loosened
    (0o750, 0, "belongs to group root (gid 0), not to --group nogroup"),  # never chgrp'ed
])
def test_serve_group_never_changes_a_directory_it_did_not_create(run_dir, mode, gid, why):
    make_dir(run_dir, mode, gid=gid)
    r = serve(run_dir / "vtalloc.sock", "--group", "nogroup")
    assert r.returncode == 1 and why in said(r) and "Traceback" not in r.stderr, r.stderr
    assert _mode_and_group(run_dir) == (mode, gid) and not os.listdir(run_dir)


@needs_root
def test_serve_group_uses_a_fitting_directory_as_it_is(run_dir):
    make_dir(run_dir, 0o710, gid=NOGROUP)  # enterable by the group, as its owner chose
    with Daemon(run_dir.parent, capacity="16MiB", args=("--group", "nogroup")):
        assert _mode_and_group(run_dir) == (0o710, NOGROUP)
    assert _mode_and_group(run_dir) == (0o710, NOGROUP)


@pytest.mark.parametrize("mode", [0o770, 0o730])
def test_serve_refuses_a_directory_writable_by_its_group(run_dir, mode):
    make_dir(run_dir, mode)
    r = serve(run_dir / "vtalloc.sock")
    assert r.returncode == 1 and f"mode 0{mode:o}: writable by group" in said(r), r.stderr
    assert stat.S_IMODE(os.lstat(run_dir).st_mode) == mode and not os.listdir(run_dir)


def test_serve_refuses_a_symlinked_directory(run_dir):
    real = make_dir(run_dir.parent / "real", 0o750)
    run_dir.symlink_to(real)
    r = serve(run_dir / "vtalloc.sock")
    assert r.returncode == 1 and "is a symbolic link" in said(r), r.stderr
    assert not os.listdir(real)


@needs_root
def test_serve_refuses_a_directory_of_another_uid(run_dir):
    make_dir(run_dir, 0o750, uid=ATTACKER)
    r = serve(run_dir / "vtalloc.sock")
    assert r.returncode == 1 and f"belongs to uid {ATTACKER}" in said(r), r.stderr
