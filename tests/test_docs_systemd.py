"""The systemd unit of docs/service.md, rendered per instance as systemd would: every device
ordinal gets valid, distinct arguments (device, socket, metrics port), which the CLI accepts.

Owns: rendering a templated unit (``%i``, ``%%``, ``$$``, continuation lines) and running its
ExecStart shell with the daemon replaced by a stand-in that prints its arguments.
Also: the unit shipped in deploy/systemd/ is the doc's, its sandbox scores what the doc says
under ``systemd-analyze security``, and the shipped sysusers.d file creates the group it needs.
Invariants: the unit is taken from the doc itself, so the doc and this test cannot disagree.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from helpers.doc_blocks import doc_blocks

from helpers.doc_blocks import ROOT as _DOC_ROOT

DAEMON = "/opt/vtalloc/bin/vtalloc"
SHIPPED = _DOC_ROOT / "deploy" / "systemd"
needs_systemd_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                           reason="systemd-analyze is not installed")
INSTANCES = (0, 1, 9, 10, 15, 99)


def _unit_text() -> str:
    units = [b.code for b in doc_blocks() if b.path == "docs/service.md" and b.lang == "ini" and "vtalloc@.service" in b.code]
    assert len(units) == 1, "docs/service.md shows one vtalloc@.service unit"
    return units[0]


def render(unit: str, instance: str) -> dict[str, str]:
    """The [Service] settings of ``unit`` for ``instance``: continuation lines joined, comments
    dropped, ``%i`` and ``%%`` replaced as systemd's specifiers are (``$$`` stays for ExecStart)."""
    settings: dict[str, str] = {}
    section, pending = "", ""
    for raw in unit.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        if section == "Service":
            settings[key] = value.replace("%i", instance).replace("%%", "%")
    return settings


def exec_argv(settings: dict[str, str], tmp_path) -> list[str]:
    """Run ExecStart as systemd would (``$$`` is a literal ``$``), with a stand-in for the daemon
    that prints the arguments it got; return them."""
    argv = shlex.split(settings["ExecStart"].replace("$$", "$"))
    stand_in = tmp_path / "vtalloc"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stand_in.chmod(0o755)
    argv = [a.replace(DAEMON, str(stand_in)) for a in argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return json.loads(out)


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_unit_gives_every_device_its_own_valid_port_and_socket(tmp_path):
    unit = _unit_text()
    seen_ports, seen_sockets = set(), set()
    for n in INSTANCES:
        settings = render(unit, str(n))
        assert settings["Type"] == "notify"
        args = exec_argv(settings, tmp_path)
        assert args[0] == "serve" and _option(args, "--device") == str(n)
        port = int(_option(args, "--metrics-port"))
        assert 1024 <= port <= 65535, f"device {n}: metrics port {port}"
        seen_ports.add(port)
        seen_sockets.add(_option(args, "--socket"))
    assert len(seen_ports) == len(seen_sockets) == len(INSTANCES)


def test_execstart_execs_the_daemon_so_it_is_the_main_process():
    """Type=notify accepts READY=1 only from the main process: the shell must exec the daemon."""
    script = shlex.split(render(_unit_text(), "3")["ExecStart"])
    assert script[:2] == ["/bin/sh", "-c"] and script[2].startswith(f"exec {DAEMON} ")


def test_the_cli_accepts_the_rendered_arguments(tmp_path):
    import typer.main

    from vtalloc.client.cli import app

    command = typer.main.get_command(app)
    for n in (0, 10):
        args = exec_argv(render(_unit_text(), str(n)), tmp_path)
        with command.make_context("vtalloc", list(args), resilient_parsing=False) as ctx:
            sub = command.get_command(ctx, "serve")
            with sub.make_context("serve", args[1:], parent=ctx) as sub_ctx:
                assert sub_ctx.params["metrics_port"] == 9460 + n
                assert sub_ctx.params["device"] == n


def test_the_old_unit_form_is_caught():
    """The renderer is not vacuous: ``946%i`` made port 94610 for device 10."""
    old = "[Service]\nExecStart=/bin/sh -c 'exec /opt/vtalloc/bin/vtalloc serve --device %i --metrics-port 946%i'\n"
    args = shlex.split(render(old, "10")["ExecStart"])[2].split()
    assert int(args[args.index("--metrics-port") + 1]) > 65535


@needs_systemd_analyze
def test_systemd_analyze_verifies_the_unit(tmp_path):
    """systemd's own parser reads the unit (an instance of it) with no complaint."""
    unit = tmp_path / "vtalloc@.service"
    unit.write_text(_unit_text())
    r = subprocess.run(["systemd-analyze", "verify", f"{tmp_path}/vtalloc@10.service"], capture_output=True,
                       text=True, timeout=60)
    complaints = [line for line in (r.stdout + r.stderr).splitlines() if "vtalloc@" in line]
    assert r.returncode == 0 and not complaints, r.stdout + r.stderr


def test_the_shipped_unit_is_the_documented_one():
    assert (SHIPPED / "vtalloc@.service").read_text() == _unit_text()


def _all_settings(unit: str) -> dict[str, list[str]]:
    """Every ``key=value`` of [Service], repeated keys kept in order."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in unit.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def test_the_sandbox_keeps_what_a_gpu_daemon_needs():
    """The GPU's device nodes stay reachable, --kill keeps CAP_KILL, the sockets' directory
    stays writable, and the metrics port (TCP) can still be opened."""
    s = _all_settings(_unit_text())
    assert "PrivateDevices" not in s and s["DevicePolicy"] == ["closed"]
    assert {"char-nvidia-frontend rw", "char-nvidia-uvm rw"} <= set(s["DeviceAllow"])
    assert s["CapabilityBoundingSet"] == ["CAP_KILL"] and s["NoNewPrivileges"] == ["yes"]
    assert s["ProtectSystem"] == ["strict"] and "/run/vtalloc" in s["ReadWritePaths"][0].split()
    assert set(s["RestrictAddressFamilies"][0].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "--metrics-port" in render(_unit_text(), "0")["ExecStart"] and s["Group"] == ["vtalloc"]


def _exposure(unit_text: str, tmp_path) -> float:
    unit = tmp_path / "vtalloc@.service"
    unit.write_text(unit_text)
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"{tmp_path}/vtalloc@0.service"],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for vtalloc@0\.service: (\d+\.\d)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    return float(m.group(1))


@needs_systemd_analyze
def test_systemd_analyze_security_rates_the_unit_as_the_doc_says(tmp_path):
    """Below 5 ("OK"), and the figure docs/service.md states; the check is not vacuous: the
    unit without its sandboxing lines rates UNSAFE."""
    text = _unit_text()
    score = _exposure(text, tmp_path)
    assert score < 5
    stated = re.search(r"rates the unit\s+\*\*(\d+\.\d) ", (_DOC_ROOT / "docs" / "service.md").read_text())
    assert stated and float(stated.group(1)) == score, f"docs/service.md states {stated and stated.group(1)}; measured {score}"
    bare = text.split("\n# Sandboxing.")[0] + "\n[Install]\nWantedBy=multi-user.target\n"
    assert "NoNewPrivileges" not in bare and _exposure(bare, tmp_path) > 9


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers is not installed")
def test_the_shipped_sysusers_file_creates_the_units_group(tmp_path):
    (tmp_path / "etc").mkdir()
    r = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(SHIPPED / "vtalloc.sysusers.conf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    groups = (tmp_path / "etc" / "group").read_text().splitlines()
    assert any(g.startswith("vtalloc:") for g in groups), groups
