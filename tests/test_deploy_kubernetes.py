"""deploy/kubernetes/: the manifests against the Kubernetes schemas (offline), least privilege, the recipe.

The schemas come with ``kubernetes-validate`` (it ships them; nothing is fetched); without the
package (or PyYAML, which it brings) those tests skip saying so. The hardening rules are the
systemd unit's (docs/service.md), restated for a pod spec (docs/kubernetes.md, "Least
privilege"): NoNewPrivileges is allowPrivilegeEscalation: false, CapabilityBoundingSet is
capabilities drop ALL plus the few named, ProtectSystem=strict a read-only root filesystem,
SystemCallFilter the RuntimeDefault seccomp profile; and no privileged container at all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
yaml = pytest.importorskip("yaml", reason="PyYAML is not installed (pip install kubernetes-validate brings it)")

DAEMON_CAPABILITIES = {"KILL"}        # --kill: SIGKILL a client of another uid (docs/kubernetes.md)
SOCKET_DIR = "/run/vtalloc"


def docs() -> list[dict]:
    out = []
    for path in MANIFESTS:
        out += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def by_kind(kind: str) -> list[dict]:
    return [d for d in docs() if d["kind"] == kind]


def pod_specs() -> list[tuple[str, dict]]:
    specs = [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in by_kind("DaemonSet")]
    return specs + [(d["metadata"]["name"], d["spec"]) for d in by_kind("Pod")]


def test_there_are_the_manifests_the_docs_name():
    assert {p.name for p in MANIFESTS} == {"namespace.yaml", "daemonset.yaml", "client-pod.yaml"}
    assert len(by_kind("DaemonSet")) == 1 and len(by_kind("Pod")) == 1


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_the_manifests_validate_offline_against_the_kubernetes_schemas(path):
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed "
                             "(pip install kubernetes-validate: it ships the schemas, nothing is fetched)")
    version = kv.latest_version()
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            kv.validate(doc, version, strict=True)  # strict: an unknown field is an error too


def test_a_misspelt_field_fails_the_validation():
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    ds = by_kind("DaemonSet")[0]
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, kv.latest_version(), strict=True)


@pytest.mark.parametrize("name, spec", pod_specs(), ids=[n for n, _ in pod_specs()])
def test_every_pod_gets_the_systemd_units_least_privilege(name, spec):
    daemon = name == "vtalloc"
    pod_sc = spec.get("securityContext", {})
    assert not spec.get("hostNetwork") and not spec.get("hostIPC")
    assert spec.get("hostPID", False) is daemon  # the daemon alone: it reads its clients' /proc/<pid>/cgroup
    assert spec.get("automountServiceAccountToken") is False
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c["securityContext"]
        assert sc.get("privileged") is False, c["name"]
        assert sc.get("allowPrivilegeEscalation") is False, c["name"]
        assert sc.get("readOnlyRootFilesystem") is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert set(sc["capabilities"].get("add", [])) <= (DAEMON_CAPABILITIES if daemon else set()), c["name"]
        seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile")
        assert seccomp == {"type": "RuntimeDefault"}, c["name"]
        assert ":latest" not in c["image"] and ":" in c["image"].rsplit("/", 1)[-1], c["image"]
    if not daemon:
        assert pod_sc.get("runAsNonRoot") is True and pod_sc.get("runAsUser", 0) != 0
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            assert v["hostPath"]["path"] == SOCKET_DIR, v  # no other host path reaches a pod
    for c in spec["containers"]:
        for m in c.get("volumeMounts", []):
            if m["name"] in {v["name"] for v in spec["volumes"] if "hostPath" in v} and not daemon:
                assert m.get("readOnly") is True  # a client connects; it never writes the directory


def _arg(args: list[str], name: str) -> str:
    found = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    assert len(found) == 1, (name, args)
    return found[0]


def test_one_daemon_per_gpu_each_with_its_device_socket_probes_and_metrics_port():
    ds = by_kind("DaemonSet")[0]
    spec = ds["spec"]["template"]["spec"]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    sockets, devices, ports = set(), set(), set()
    for c in spec["containers"]:
        args = c["args"]
        assert args[0] == "serve" and _arg(args, "principal-by") == "pod" and _arg(args, "backend") == "cuda"
        socket = _arg(args, "socket")
        assert socket.startswith(SOCKET_DIR + "/") and Path(socket).parent != Path(SOCKET_DIR)  # its own directory
        sockets.add(socket)
        env = {e["name"]: e["value"] for e in c["env"]}
        devices.add(env["NVIDIA_VISIBLE_DEVICES"])
        assert _arg(args, "device") == "0"  # the one GPU the container sees
        port = int(_arg(args, "metrics-port"))
        assert [p["containerPort"] for p in c["ports"]] == [port] and _arg(args, "metrics-addr") == "0.0.0.0"
        ports.add(port)
        for probe in ("livenessProbe", "readinessProbe"):
            command = c[probe]["exec"]["command"]
            assert command[:2] == ["vtalloc", "health"] and f"--socket={socket}" in command
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {SOCKET_DIR}
    n = len(spec["containers"])
    assert len(sockets) == len(devices) == len(ports) == n >= 2
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) in ports
    assert spec["securityContext"]["supplementalGroups"] == [2300]


def test_the_client_pod_names_a_daemons_socket_and_declares_its_quota():
    from vtalloc.server.protocol.declared_quota import declared_from_env

    ds_sockets = {_arg(c["args"], "socket") for c in by_kind("DaemonSet")[0]["spec"]["template"]["spec"]["containers"]}
    pod = by_kind("Pod")[0]
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["VTALLOC_SOCKET"].removeprefix("unix://") in ds_sockets
    lo, hi = declared_from_env(env)
    assert lo is not None and hi is not None and lo <= hi
    assert 2300 in pod["spec"]["securityContext"]["supplementalGroups"]


def test_the_containerfile_follows_the_basics():
    """What hadolint would say first (no hadolint here): pinned bases, exec-form entrypoint, no
    caches or package lists left, apt without recommends, an explicit USER, no remote ADD."""
    text = (DEPLOY / "Containerfile").read_text()
    lines = [ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln.split()[1] for ln in lines if ln.startswith("FROM ")]
    assert froms and all(re.search(r":[0-9][\w.-]*$|@sha256:", f) and ":latest" not in f for f in froms), froms
    for ln in lines:
        if "apt-get install" in ln:
            assert "--no-install-recommends" in ln and "-y" in ln and "rm -rf /var/lib/apt/lists" in ln
        if "pip install" in ln or "pip wheel" in ln:
            assert "--no-cache-dir" in ln, ln
        assert not re.match(r"ADD\s+https?://", ln), ln
        assert not ln.startswith("RUN cd "), ln   # WORKDIR instead
    assert any(ln.startswith("USER ") for ln in lines)
    entry = [ln for ln in lines if ln.startswith("ENTRYPOINT")]
    assert entry == ['ENTRYPOINT ["vtalloc"]']
    assert "groupadd --gid 2300 vtalloc" in text  # the DaemonSet's --group and supplementalGroups
    ignore = (DEPLOY / "Containerfile.dockerignore").read_text().split()
    assert ".git" in ignore and ".venv" in ignore


def test_the_daemon_image_installs_no_torch():
    """The image pulled torch (GBs) for a daemon that never uses it; torch and cuda-python are
    extras now, and the image installs the wheel without them (tests/test_without_torch.py runs
    the daemon and the CLI with neither importable)."""
    text = (DEPLOY / "Containerfile").read_text()
    lines = [ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines() if ln.strip() and not ln.startswith("#")]
    installs = [ln for ln in lines if "pip install" in ln]
    assert installs and not [ln for ln in installs if re.search(r"\btorch\b|cuda-python|vtalloc-\S*\[", ln)], installs
