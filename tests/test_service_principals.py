"""Pods as principals (``vtalloc serve --principal-by pod``) and quotas a client declares.

Parsing of the kubelet's cgroup layouts runs everywhere, from fixtures of ``/proc/<pid>/cgroup``.
The end-to-end tests put real client processes into real cgroups laid out as the kubelet lays
them out, under a real daemon in its own cgroup namespace (as a DaemonSet's container is): they
need root and a writable cgroup v2 hierarchy, and are skipped with the reason otherwise.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import uuid
from pathlib import Path

import pytest
from helpers.service import ClientProc, Daemon
from helpers.sizes import PAGE
from helpers.ledger_checks import check_invariants

from vtalloc.allocator import InvalidArgumentError
from vtalloc.server.daemon import DaemonConfig
from vtalloc.server.errors import PermissionDeniedError, QuotaExceededError
from vtalloc.server.ledger import Ledger, NodeGeometry
from vtalloc.server.principals import (PeerIdentityError, cgroup_v2_path, limit_key, peer_cgroup, pod_from_cgroup,
                                       under_cgroup)
from vtalloc.server.protocol.declared_quota import declared_from_env, declared_from_hello, hello_field
from vtalloc.server.quota import Quota, check_principal, parse_principal_map

POD = "3f0c6a2e-1b2c-4d5e-8f90-123456789abc"
OTHER = "9d8e7f60-5a4b-4c3d-9e2f-0a1b2c3d4e5f"
STATIC = "6a3ab5dd1c7e7f6b0c8c6f02a3cc8d2e"  # a static pod's UID: a hash, 32 hex digits
SD = POD.replace("-", "_")
CID = "4f1d2c" + "0" * 58  # a 64-hex container id
V1_LINES = "12:memory:/kubepods/burstable/podX\n11:pids:/kubepods\n1:name=systemd:/kubepods\n"

# /proc/<pid>/cgroup as a pod's process shows it, one per kubelet layout and QoS class.
KUBELET_FIXTURES = {
    "systemd burstable": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD}.slice/"
                         f"cri-containerd-{CID}.scope\n",
    "systemd besteffort": f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SD}.slice/"
                          f"crio-{CID}.scope\n",
    "systemd guaranteed": f"0::/kubepods.slice/kubepods-pod{SD}.slice/docker-{CID}.scope\n",
    "cgroupfs burstable": f"0::/kubepods/burstable/pod{POD}/{CID}\n",
    "cgroupfs besteffort": f"0::/kubepods/besteffort/pod{POD}/{CID}\n",
    "cgroupfs guaranteed": f"0::/kubepods/pod{POD}/{CID}\n",
    "hybrid host (v1 lines first)": V1_LINES + f"0::/kubepods/burstable/pod{POD}/{CID}\n",
    "a container's own subcgroup": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD}.slice/"
                                   f"cri-containerd-{CID}.scope/worker\n",
    # The daemon in a container sees others from its own cgroup namespace: paths go up first.
    "namespaced, same QoS": f"0::/../../kubepods-burstable-pod{SD}.slice/cri-containerd-{CID}.scope\n",
    "namespaced, other QoS": f"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{SD}.slice/x.scope\n",
    "namespaced cgroupfs": f"0::/../../pod{POD}/{CID}\n",
}

# Paths that must not yield a pod (or must yield the outer, real one).
NOT_A_POD = {
    "host user's delegated subtree": f"0::/user.slice/user-1000.slice/user@1000.service/app.slice/"
                                     f"kubepods-burstable-pod{SD}.slice/x.scope\n",
    "a look-alike below the root": f"0::/system.slice/kubepods.slice/kubepods-pod{SD}.slice/x.scope\n",
    "QoS slice not the pod's": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{SD}.slice/x\n",
    "pod slice with QoS outside its slice": f"0::/kubepods.slice/kubepods-burstable-pod{SD}.slice/x\n",
    "dashes in a systemd name": f"0::/kubepods.slice/kubepods-pod{POD}.slice/x\n",
    "underscores in a cgroupfs name": f"0::/kubepods/pod{SD}/x\n",
    "upper-case uid": f"0::/kubepods/pod{POD.upper()}/x\n",
    "short uid": "0::/kubepods/pod1234/x\n",
    "'..' inside the path": f"0::/kubepods/../kubepods/pod{POD}/x\n",
    "empty component": f"0::/kubepods//pod{POD}/x\n",
    "no cgroup v2 line": V1_LINES,
    "not absolute": f"0::kubepods/pod{POD}/x\n",
    "the daemon's own container": "0::/\n",
    "a sibling container of the daemon's pod": "0::/../cri-containerd-abc.scope\n",
}


@pytest.mark.parametrize("name", sorted(KUBELET_FIXTURES))
def test_both_kubelet_layouts_name_the_pod(name):
    assert pod_from_cgroup(cgroup_v2_path(KUBELET_FIXTURES[name])) == POD


def test_a_static_pods_hash_uid_is_a_pod_uid():
    assert pod_from_cgroup(f"/kubepods/besteffort/pod{STATIC}/{CID}") == STATIC
    assert pod_from_cgroup(f"/kubepods.slice/kubepods-pod{STATIC}.slice/x.scope") == STATIC
    assert check_principal(f"pod:{STATIC}") and check_principal(f"pod:{POD}")


@pytest.mark.parametrize("name", sorted(NOT_A_POD))
def test_paths_not_the_kubelets_from_their_first_component_name_no_pod(name):
    path = cgroup_v2_path(NOT_A_POD[name])
    assert path is None or pod_from_cgroup(path) is None


def test_a_pod_lookalike_nested_in_a_real_pod_is_still_the_real_pod():
    # A container that may create cgroups below its own cannot become another pod.
    forged = (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SD}.slice/cri-containerd-{CID}.scope/"
              f"kubepods-burstable-pod{OTHER.replace('-', '_')}.slice")
    assert pod_from_cgroup(forged) == POD
    assert pod_from_cgroup(f"/kubepods/pod{POD}/{CID}/kubepods/pod{OTHER}/x") == POD


def test_admin_cgroups_match_whole_components_and_never_a_path_outside_the_namespace():
    assert under_cgroup("/user.slice/user-0.slice/session-1.scope", "/user.slice")
    assert not under_cgroup("/user.slice.evil/x", "/user.slice")
    assert not under_cgroup("/../user.slice/x", "/user.slice")
    assert not under_cgroup("/../kubepods.slice/x", "/")


def test_principal_names_and_limit_keys():
    assert limit_key(0, POD) == f"pod:{POD}" and limit_key(1000, None) == 1000
    with pytest.raises(InvalidArgumentError):
        check_principal("pod:not-a-uid")
    with pytest.raises(InvalidArgumentError, match="may not start with 'uid:' or 'pod:'"):
        parse_principal_map([f"pod:{POD}=1000"])


# -- reading a peer's cgroup ---------------------------------------------------------------------
def test_a_peer_the_daemon_cannot_see_or_pin_is_refused_not_guessed():
    with pytest.raises(PeerIdentityError, match="pid namespace"):
        peer_cgroup(0, None, exact_pidfd=True)
    with pytest.raises(PeerIdentityError, match="no pidfd"):
        peer_cgroup(os.getpid(), None, exact_pidfd=True)
    fd = os.pidfd_open(os.getpid())
    try:
        with pytest.raises(PeerIdentityError, match="reused"):  # started after the connection was accepted
            peer_cgroup(os.getpid(), fd, exact_pidfd=False, accepted_ticks=10, start_ticks=11)
        with pytest.raises(PeerIdentityError, match="reused"):
            peer_cgroup(os.getpid(), fd, exact_pidfd=False, accepted_ticks=10, start_ticks=None)
        ident = peer_cgroup(os.getpid(), fd, exact_pidfd=True)
        assert ident.cgroup == cgroup_v2_path(Path(f"/proc/{os.getpid()}/cgroup").read_text())
    finally:
        os.close(fd)


def test_a_peer_that_exits_before_its_cgroup_is_read_is_refused():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    fd = os.pidfd_open(pid)
    try:
        os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: /proc/<pid> is a zombie
        with pytest.raises(PeerIdentityError):
            peer_cgroup(pid, fd, exact_pidfd=True)
    finally:
        os.waitpid(pid, 0)
        os.close(fd)


# -- the ledger, per principal -------------------------------------------------------------------
def pod_ledger(**kw) -> Ledger:
    return Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0), default_quota=Quota("", 0, 4 * PAGE),
                  admin_uids=(0,), admin_cgroups=("/system.slice/vtalloc.service", "/user.slice"), **kw)


def lease(ledger, s, first, k):
    assert ledger.leases.admit(s, k) == 0
    ids = list(range(first, first + k))
    ledger.leases.add_pages(s, ids)
    ledger.leases.mark_delivered(s, ids)
    return ids


def test_two_pods_of_one_uid_are_two_principals_with_their_own_quotas_and_no_view_of_each_other():
    ledger = pod_ledger()
    a = ledger.sessions.open(10, 0, 0, "client", cgroup="/kubepods/pod-a", pod=POD)
    b = ledger.sessions.open(11, 0, 0, "client", cgroup="/kubepods/pod-b", pod=OTHER)
    assert (a.principal, b.principal) == (f"pod:{POD}", f"pod:{OTHER}")
    pages = lease(ledger, a, 1, 4)
    with pytest.raises(QuotaExceededError):
        ledger.leases.admit(a, 1)
    lease(ledger, b, 100, 4)  # one shared uid:0 quota would refuse this
    with pytest.raises(PermissionDeniedError):
        ledger.leases.give_back(b, pages[:1])
    with pytest.raises(PermissionDeniedError, match="another uid or principal"):
        ledger.sessions.find(b, a.session_id)
    view = ledger.views.node_view(b)
    assert [s.info.session_id for s in view.sessions] == [b.session_id] and view.hidden_sessions == 1
    assert [p.quota.principal for p in view.principals] == [f"pod:{OTHER}"]
    assert ledger.views.page_map(b).hidden_pages == 4
    assert not ledger.sessions.is_admin(a) and not ledger.sessions.is_admin(b)  # root in a pod is not the node's root
    check_invariants(ledger)


def test_in_pod_mode_an_admin_uid_is_admin_only_in_the_daemons_cgroup_or_an_admin_cgroup():
    ledger = pod_ledger()
    own = ledger.sessions.open(1, 0, 0, "observer", cgroup="/system.slice/vtalloc.service")
    below_own = ledger.sessions.open(2, 0, 0, "observer", cgroup="/system.slice/vtalloc.service/x")
    login = ledger.sessions.open(3, 0, 0, "observer", cgroup="/user.slice/user-0.slice/session-1.scope")
    user = ledger.sessions.open(4, 1000, 1000, "observer", cgroup="/user.slice/user-1000.slice/session-2.scope")
    outside = ledger.sessions.open(5, 0, 0, "observer", cgroup="/../user.slice/x")
    assert [ledger.sessions.is_admin(s) for s in (own, below_own, login, user, outside)] == [True, False, True, False, False]
    uid_mode = Ledger(NodeGeometry("host", 0, PAGE, 16, 0, 1.0), admin_uids=(0,))
    assert uid_mode.sessions.is_admin(uid_mode.sessions.open(1, 0, 0, "observer"))


def test_a_process_outside_any_pod_stays_its_uid():
    ledger = pod_ledger()
    s = ledger.sessions.open(10, 1000, 1000, "client", cgroup="/user.slice/user-1000.slice/x.scope", pod=None)
    assert s.principal == "uid:1000"


# -- declared quotas -----------------------------------------------------------------------------
def test_a_declared_quota_only_lowers_and_lasts_as_long_as_its_session():
    ledger = pod_ledger(quotas=[Quota(f"pod:{POD}", 2 * PAGE, 6 * PAGE)])
    plain = ledger.sessions.open(10, 0, 0, "client", pod=POD)
    assert ledger.quotas.of(f"pod:{POD}") == Quota(f"pod:{POD}", 2 * PAGE, 6 * PAGE)
    greedy = ledger.sessions.open(11, 0, 0, "client", pod=POD, declared=(8 * PAGE, 1 << 50))
    assert ledger.quotas.of(f"pod:{POD}") == Quota(f"pod:{POD}", 2 * PAGE, 6 * PAGE)  # never raised
    modest = ledger.sessions.open(12, 0, 0, "client", pod=POD, declared=(PAGE, 3 * PAGE))
    assert ledger.quotas.of(f"pod:{POD}") == Quota(f"pod:{POD}", PAGE, 3 * PAGE)
    lease(ledger, plain, 1, 3)
    with pytest.raises(QuotaExceededError):
        ledger.leases.admit(plain, 1)  # the pod's declaration binds all of the pod's sessions
    ledger.sessions.end(modest, clean=True)
    assert ledger.quotas.of(f"pod:{POD}").max_bytes == 6 * PAGE
    observer = ledger.sessions.open(13, 0, 0, "observer", pod=POD, declared=(0, 0))
    assert ledger.quotas.of(f"pod:{POD}").max_bytes == 6 * PAGE  # an observer declares nothing
    assert ledger.quotas.of(f"pod:{OTHER}") == Quota(f"pod:{OTHER}", 0, 4 * PAGE)  # others untouched
    for s in (plain, greedy, observer):
        ledger.sessions.end(s, clean=True)


def test_a_declared_minimum_above_the_declared_maximum_is_lowered_with_it():
    assert Quota("p", 4, 10).lowered(None, 2) == Quota("p", 2, 2)
    assert Quota("p", 4, 10).lowered(8, None) == Quota("p", 4, 10)


@pytest.mark.parametrize("env, want", [
    ({}, None),
    ({"VTALLOC_QUOTA_MAX": "8GiB"}, (None, 8 << 30)),
    ({"VTALLOC_QUOTA_MIN": "0", "VTALLOC_QUOTA_MAX": "512MiB"}, (0, 512 << 20)),
    ({"VTALLOC_QUOTA_MIN": "1GB", "VTALLOC_QUOTA_MAX": ""}, (10 ** 9, None)),
])
def test_declared_quota_from_env(env, want):
    assert declared_from_env(env) == want


@pytest.mark.parametrize("env, match", [
    ({"VTALLOC_QUOTA_MAX": "lots"}, r"\$VTALLOC_QUOTA_MAX: cannot parse"),
    ({"VTALLOC_QUOTA_MAX": "64mb"}, r"\$VTALLOC_QUOTA_MAX: .* ambiguous"),
    ({"VTALLOC_QUOTA_MIN": "-1"}, r"\$VTALLOC_QUOTA_MIN"),
    ({"VTALLOC_QUOTA_MIN": "2GiB", "VTALLOC_QUOTA_MAX": "1GiB"}, "above the declared maximum"),
    ({"VTALLOC_QUOTA_MAX": "99999999999TiB"}, r"\$VTALLOC_QUOTA_MAX of .* beyond"),
])
def test_a_malformed_declared_quota_is_a_typed_error_naming_the_variable(env, match):
    with pytest.raises(InvalidArgumentError, match=match):
        declared_from_env(env)


@pytest.mark.parametrize("field", [
    "x", [1, 2], {"max": -1}, {"max": 1.5}, {"max": True}, {"max": "8GiB"}, {"min": 1 << 64},
    {"min": 5, "max": 4}, {"max": 4, "extra": 1},
])
def test_a_hello_with_a_malformed_quota_is_refused(field):
    with pytest.raises(InvalidArgumentError):
        declared_from_hello({"t": "hello", "quota": field})


def test_hello_quota_round_trip():
    assert declared_from_hello({"t": "hello", **hello_field((None, 4096))}) == (None, 4096)
    assert declared_from_hello({"t": "hello"}) is None and hello_field(None) == {}


def test_serve_options_are_checked():
    with pytest.raises(InvalidArgumentError, match="--principal-by"):
        DaemonConfig("/tmp/x.sock", principal_by="container")
    with pytest.raises(InvalidArgumentError, match="needs --principal-by pod"):
        DaemonConfig("/tmp/x.sock", admin_cgroups=("/user.slice",))
    for bad in ("/", "user.slice", "/a/../b"):
        with pytest.raises(InvalidArgumentError, match="--admin-cgroup"):
            DaemonConfig("/tmp/x.sock", principal_by="pod", admin_cgroups=(bad,))


# -- real processes in real cgroups ---------------------------------------------------------------
def _cgroup2_mount() -> tuple[Path | None, str]:
    """A writable cgroup v2 hierarchy mounted at its root, or None and why not."""
    if os.geteuid() != 0:
        return None, "creating cgroups and moving processes needs root"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError as e:
        return None, f"no /proc/self/mountinfo: {e}"
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and fields[3] == "/" and "rw" in fields[5].split(","):
            return Path(fields[4]), ""
    return None, "no cgroup v2 hierarchy mounted read-write at its root (cgroup v1 only, or a container's view)"


class Cgroups:
    """A scratch tree of cgroups, laid out as the kubelet lays them out, removed afterwards."""

    def __init__(self, mount: Path) -> None:
        self.root = mount / f"vt-test-{secrets.token_hex(4)}"
        self.made: list[Path] = []

    def make(self, rel: str) -> Path:
        path = self.root
        for part in [p for p in rel.split("/") if p] if rel else []:
            path = path / part
            if not path.exists():
                path.mkdir()
                self.made.append(path)
        return path

    def pod(self, pod_uid: str) -> Path:
        sd = pod_uid.replace("-", "_")
        return self.make(f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd}.slice/"
                         f"cri-containerd-{secrets.token_hex(32)}.scope")

    @staticmethod
    def move(pid: int, cgroup: Path) -> None:
        (cgroup / "cgroup.procs").write_text(str(pid))

    def daemon_preexec(self, cgroup: Path):
        """Enter ``cgroup`` and a new cgroup namespace rooted there, as a container's daemon would be."""
        procs = str(cgroup / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write("0")
            if ctypes.CDLL(None, use_errno=True).unshare(0x02000000) != 0:  # CLONE_NEWCGROUP
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWCGROUP)")
        return enter

    def remove(self) -> None:
        for path in reversed([self.root, *self.made]):
            try:
                path.rmdir()
            except OSError:
                pass


@pytest.fixture
def cgroups():
    mount, why = _cgroup2_mount()
    if mount is None:
        pytest.skip(why)
    c = Cgroups(mount)
    try:
        c.make("")
        c.root.mkdir(exist_ok=True)
        c.made.insert(0, c.root)
    except OSError as e:
        pytest.skip(f"cannot create a cgroup under {mount}: {e}")
    yield c
    c.remove()


def in_cgroup(c: ClientProc, cgroups: Cgroups, where: Path) -> ClientProc:
    cgroups.move(c.pid, where)
    return c


def test_two_clients_in_two_pods_under_one_uid_have_separate_quotas_and_cannot_touch_each_other(cgroups):
    pod_a, pod_b = str(uuid.uuid4()), str(uuid.uuid4())
    where_a, where_b, own = cgroups.pod(pod_a), cgroups.pod(pod_b), cgroups.make("vtalloc-daemon")
    args = ("--principal-by", "pod", "--default-quota", f"0:{4 * PAGE}", "--max-sessions-per-uid", "1")
    with Daemon(capacity=f"{16 * PAGE}", args=args, preexec=cgroups.daemon_preexec(own)) as d, \
            ClientProc() as a, ClientProc() as b, ClientProc() as admin:
        in_cgroup(a, cgroups, where_a)
        in_cgroup(b, cgroups, where_b)
        in_cgroup(admin, cgroups, own)  # `kubectl exec` into the daemon's container
        sid_a = a.ok("raw_open", address=d.address)["session_id"]
        b.ok("raw_open", address=d.address)

        def rpc(c, method, request_type, request, service="pages"):
            return c.call("rpc", service=service, method=method, request_type=request_type, request=request)

        assert rpc(a, "GetSession", "GetSessionRequest", {})["reply"]["principal"] == f"pod:{pod_a}"
        assert rpc(b, "GetSession", "GetSessionRequest", {})["reply"]["principal"] == f"pod:{pod_b}"
        pages_a = a.ok("raw_lease", pages=4)["page_ids"]
        assert a.call("raw_lease", pages=1)["error"] == "QuotaExceededError"
        assert len(b.ok("raw_lease", pages=4)["page_ids"]) == 4  # its own quota: uid 0 alone would refuse it
        # Limits count per pod: pod A at its one session does not stop pod B (nor B stop A).
        r = a.call("open", address=d.address)
        assert r["error"] == "LimitExceededError" and f"pod:{pod_a} already has 1 open sessions" in r["message"]
        # B (root, like A) can neither return, see, list nor evict A's pages, nor act as admin.
        assert rpc(b, "Return", "ReturnRequest", {"page_ids": pages_a})["error"] == "PermissionDeniedError"
        assert rpc(b, "GetStats", "GetStatsRequest", {"session_id": sid_a})["error"] == "PermissionDeniedError"
        assert rpc(b, "ListPages", "ListPagesRequest", {"session_id": sid_a})["error"] == "PermissionDeniedError"
        stats = rpc(b, "GetStats", "GetStatsRequest", {})["reply"]
        assert sid_a not in [s["info"]["session_id"] for s in stats.get("sessions", [])]
        assert stats["hidden_sessions"] >= 1 and not stats.get("admin_view", False)
        assert rpc(b, "ListPages", "ListPagesRequest", {})["reply"]["hidden_pages"] >= 4
        assert rpc(b, "EvictSession", "EvictSessionRequest", {"session_id": sid_a, "pages": 1},
                   "admin")["error"] == "PermissionDeniedError"
        assert rpc(b, "SetQuota", "SetQuotaRequest", {"principal": f"pod:{pod_b}", "min_bytes": 0,
                                                      "max_bytes": 1 << 40}, "admin")["error"] == "PermissionDeniedError"
        # Root in the daemon's own cgroup is the node's admin: it sees both pods and sets their quotas.
        admin.ok("raw_open", address=d.address, kind="observer")
        stats = rpc(admin, "GetStats", "GetStatsRequest", {})["reply"]
        assert stats.get("admin_view") and {f"pod:{pod_a}", f"pod:{pod_b}"} <= {
            p["quota"]["principal"] for p in stats["principals"]}
        assert "error" not in rpc(admin, "SetQuota", "SetQuotaRequest", {"principal": f"pod:{pod_a}", "min_bytes": 0,
                                                                        "max_bytes": 6 * PAGE}, "admin")
        assert len(a.ok("raw_lease", pages=2)["page_ids"]) == 2
        assert "pod:" in d.log()


def test_a_pods_declared_quota_applies_within_the_operators(cgroups):
    pod = str(uuid.uuid4())
    where, own = cgroups.pod(pod), cgroups.make("vtalloc-daemon")
    args = ("--principal-by", "pod", "--default-quota", f"0:{4 * PAGE}")
    with Daemon(capacity=f"{16 * PAGE}", args=args, preexec=cgroups.daemon_preexec(own)) as d, \
            ClientProc(env={"VTALLOC_QUOTA_MAX": f"{2 * PAGE}"}) as modest, \
            ClientProc(env={"VTALLOC_QUOTA_MAX": "1TiB"}) as greedy:
        in_cgroup(modest, cgroups, where)
        in_cgroup(greedy, cgroups, where)
        greedy.ok("raw_open", address=d.address)
        assert greedy.call("raw_lease", pages=5)["error"] == "QuotaExceededError"  # the operator's 4 pages win
        modest.ok("raw_open", address=d.address)
        assert modest.call("raw_lease", pages=3)["error"] == "QuotaExceededError"  # the pod asked for 2
        assert len(modest.ok("raw_lease", pages=2)["page_ids"]) == 2


def test_a_malformed_declared_quota_fails_the_client_before_it_says_hello():
    with Daemon(capacity=f"{8 * PAGE}") as d, ClientProc(env={"VTALLOC_QUOTA_MAX": "64mb"}) as c:
        r = c.call("raw_open", address=d.address)
        assert r["error"] == "InvalidArgumentError" and "VTALLOC_QUOTA_MAX" in r["message"]
        assert "dropped" not in d.log()  # nothing reached the daemon
