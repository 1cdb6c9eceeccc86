"""VTALLOC_CONF, the precedence of the environment's sources, and warnings on unknown VTALLOC_* names."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from vtalloc.allocator import AddressSpace, Config, InvalidArgumentError
from vtalloc.allocator import config as config_mod

MiB, GiB = 1 << 20, 1 << 30
ROOT = Path(__file__).resolve().parent.parent


def test_conf_string_sets_fields():
    c = Config.from_env({"VTALLOC_CONF": " capacity:60GiB, page_size:4MiB,backend:host,evict_mode:copy,device:1,"})
    assert (c.capacity, c.page_size, c.backend, c.evict_mode, c.device) == (60 * GiB, 4 * MiB, "host", "copy", 1)


def test_precedence_keywords_then_single_variables_then_conf():
    env = {"VTALLOC_CONF": "capacity:1GiB,page_size:4MiB,backend:host", "VTALLOC_CAPACITY": "2GiB"}
    c = Config.from_env(env)
    assert (c.capacity, c.page_size) == (2 * GiB, 4 * MiB)  # the single variable wins over VTALLOC_CONF
    assert Config.from_env(env, capacity="3GiB", page_size=None).capacity == 3 * GiB  # keywords win over both
    assert Config.from_env(env, page_size=None).page_size == 4 * MiB  # None: not given


@pytest.mark.parametrize("conf, match", [
    ("capactiy:1GiB", r"VTALLOC_CONF: unknown key 'capactiy' \(did you mean 'capacity'\?\)"),
    ("capacity=1GiB", r"VTALLOC_CONF: 'capacity=1GiB' is not key:value"),
    ("capacity:", r"is not key:value"),
    ("capacity:lots", r"VTALLOC_CONF key 'capacity': cannot parse 'lots'"),
    ("page_size:2MiB,page_size:4MiB", r"key 'page_size' is given twice"),
    ("device:gpu", r"VTALLOC_CONF key 'device' must be an integer"),
    ("backend:tpu", r"backend must be one of"),
])
def test_bad_conf_is_a_typed_error_naming_the_key(conf, match):
    with pytest.raises(InvalidArgumentError, match=match):
        Config.from_env({"VTALLOC_CONF": conf})


def test_bad_single_variable_names_field_and_variable():
    with pytest.raises(InvalidArgumentError, match=r"capacity \(VTALLOC_CAPACITY\): cannot parse"):
        Config.from_env({"VTALLOC_CAPACITY": "12 parsecs"})


def test_unknown_variable_warns_once_with_a_suggestion(monkeypatch):
    monkeypatch.setattr(config_mod, "_warned", set())
    env = {"VTALLOC_CAPACTIY": "1GiB", "VTALLOC_BACKEND": "host"}
    with pytest.warns(config_mod.ConfigWarning, match=r"VTALLOC_CAPACTIY .*ignored \(did you mean 'VTALLOC_CAPACITY'\?\)"):
        c = Config.from_env(env)
    assert c.capacity is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Config.from_env(env)  # once per process


def test_every_vtalloc_variable_the_project_reads_is_known(monkeypatch):
    """Grep the sources for VTALLOC_* names: none of them is warned about."""
    names = set()
    for pattern in ("allocator/*.py", "server/**/*.py", "client/*.py", "tests/**/*.py", "benchmarks/**/*.py", "csrc/**/*.[ch]pp"):
        for path in ROOT.glob(pattern):
            names |= set(re.findall(r"\bVTALLOC_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    names -= {"VTALLOC_CAPACTIY"}  # this file's typo
    assert {"VTALLOC_SOCKET", "VTALLOC_PUBLISH_STATS", "VTALLOC_CAPACITY", "VTALLOC_CONF"} <= names
    monkeypatch.setattr(config_mod, "_warned", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_mod.warn_unknown_env({n: "1" for n in names if n in config_mod.known_env()})
    assert names <= config_mod.known_env(), sorted(names - config_mod.known_env())


def test_address_space_does_not_read_the_environment(monkeypatch):
    """AddressSpace() takes its settings from its arguments only; Config.from_env() is the way in."""
    monkeypatch.setenv("VTALLOC_CONF", "capacity:32MiB")
    monkeypatch.setenv("VTALLOC_EVICT_MODE", "copy")
    with AddressSpace(backend="host", capacity="64MiB") as space:
        assert space.capacity_bytes == 64 * MiB and space.config.evict_mode == "auto"
    with AddressSpace(config=Config.from_env(backend="host")) as space:
        assert space.capacity_bytes == 32 * MiB and space.evict_mode == "copy"


def test_warning_reaches_a_user_of_the_torch_allocator():
    code = ("import warnings, vtalloc.allocator.torch as vt\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    vt.resolve_config()\n"
            "print([str(x.message) for x in w])\n")
    env = {"PATH": "/usr/bin:/bin", "VTALLOC_CAPACTIY": "1GiB"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "VTALLOC_CAPACTIY is not a vtalloc variable" in out.stdout
