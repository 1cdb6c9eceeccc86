"""The reliability suite's bounded part (issue 11): benchmarks/soak.py --quick, campaign by
campaign, must end with no outcome other than a typed error, nothing lost, nothing leaked and
totals that balance; and the regression tests of what the campaigns found.

Owns: running the quick campaigns in subprocesses (a crash there is a failed test, not a dead
test run) and checking their JSON; the regression tests of the soak's findings.
Invariants: each campaign's "other" count is 0 and its figures are not empty (a campaign that
tried nothing cannot pass).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vtalloc.allocator import AddressSpace, InvalidArgumentError

ROOT = Path(__file__).resolve().parent.parent


def soak(tmp_path: Path, campaign: str, timeout: float = 120) -> dict:
    out = tmp_path / f"soak-{campaign}.json"
    p = subprocess.run([sys.executable, "benchmarks/soak.py", "--quick", "--only", campaign, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), f"soak {campaign} wrote nothing (exit {p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    record = json.loads(out.read_text())
    assert p.returncode == 0, f"soak {campaign}: {record['other_total']} other outcomes\n{p.stdout[-3000:]}"
    return record["campaigns"][campaign]


# -- regression tests of the findings ---------------------------------------------------------

@pytest.mark.parametrize("value", [10 ** 5000, -(10 ** 5000)], ids=["huge", "huge_negative"])
def test_an_integer_too_long_to_print_is_a_typed_error(value):
    """malloc(10**5000) raised a plain ValueError: the error message formatted the int, and
    CPython refuses str() of ints past 4,300 digits."""
    with AddressSpace(backend="host", capacity="8MiB") as s:
        with pytest.raises(InvalidArgumentError, match="bits"):
            s.malloc(value)
        with pytest.raises(InvalidArgumentError):
            s.free(value)


# -- the quick campaigns ----------------------------------------------------------------------

def test_hostile_inputs_to_the_python_api_and_the_c_abi_are_all_typed_errors(tmp_path):
    got = soak(tmp_path, "api")
    for interface in ("python_api", "c_abi"):
        assert got[interface]["tried"] > 50 and got[interface]["other"] == 0, got[interface]
    assert got["leaks_after"] == {}


def test_a_fault_at_every_backend_call_site_is_typed_loses_nothing_and_leaks_nothing(tmp_path):
    got = soak(tmp_path, "faults")
    assert got["injected"]["other"] == 0, got["injected"]
    assert got["injected"]["tried"] > 50
    reached = {site.split("/")[0] for site, n in got["call_sites"].items() if n}
    assert {"malloc_fresh", "malloc_under_pressure", "offload", "prefetch_restore", "lease"} <= reached
    assert got["leaks_after"] == {}


def test_hostile_grpc_requests_and_side_channel_messages_are_all_refused_typed(tmp_path):
    got = soak(tmp_path, "service")
    for interface in ("grpc", "side_channel"):
        assert got[interface]["tried"] > 50 and got[interface]["other"] == 0, got[interface]


def test_killed_clients_are_reclaimed_at_every_lease_stage_and_a_killed_daemon_restarts(tmp_path):
    got = soak(tmp_path, "kills")
    assert got["kills"]["other"] == 0, got["kills"]
    assert {"after_hello", "mid_lease", "holding_pages", "during_eviction_request",
            "daemon_restart_to_first_lease"} <= set(got["reclaim_ms"])


def test_concurrent_processes_and_threads_balance(tmp_path):
    got = soak(tmp_path, "concurrency")
    assert got["balance"]["other"] == 0, got["balance"]
    svc, local = got["service"], got["local"]
    assert svc["leased"] == svc["returned"] > 0 and svc["corrupt"] == svc["held_at_end"] == 0
    assert local["malloc"] == local["free"] > 0 and local["corrupt"] == 0
    assert got["leaks_after"] == {}


def test_round_three_attacks_are_all_refused_or_harmless(tmp_path):
    """Issue 38's classes (runtime-file races, descriptor retention, connection floods, per-session
    state): every attempt refused or harmless, and each class tried something."""
    got = soak(tmp_path, "round3", timeout=300)
    for cls in ("runtime_files", "retention", "connection_floods", "session_state"):
        assert got[cls]["tried"] >= 4 and got[cls]["other"] == 0, (cls, got[cls])
