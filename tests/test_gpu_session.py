"""benchmarks/gpu_session.py, the stages a GPU session runs, checked without a GPU.

Owns: that every stage fits one lent call (its estimates within its budget), that every step
names a script that exists and flags that script accepts, and the runner's rules (a failing step
does not stop the stage, a step that no longer fits is skipped, the summary records each).
Invariants: nothing here needs a GPU; the runner is exercised with a stage of harmless steps.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.benchmarks import load_script

ROOT = Path(__file__).resolve().parent.parent


session = load_script("gpu_session")


@pytest.mark.parametrize("name", sorted(session.STAGES))
def test_each_stage_fits_one_call(name):
    stage = session.STAGES[name]
    assert session.plan_fits(stage), f"{name}: ~{sum(s.estimate_s for s in stage)} s over {session.STAGE_BUDGET_S} s"
    assert all(s.estimate_s <= s.timeout_s for s in stage)


def _script_steps():
    for name, stage in session.STAGES.items():
        for step in stage:
            if step.argv[0] == "{py}" and step.argv[1].endswith(".py"):
                yield pytest.param(step, id=f"{name}-{step.name}")


@pytest.mark.parametrize("step", list(_script_steps()))
def test_every_step_names_a_script_and_flags_it_accepts(step):
    script = ROOT / step.argv[1]
    assert script.is_file(), f"{step.name}: {script} does not exist"
    help_text = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT,
                               timeout=120).stdout
    flags = [a.split("=")[0] for a in step.argv[2:] if a.startswith("--")]
    accepted = set(re.findall(r"--[a-z][a-z0-9-]*", help_text))
    if "--build-if-needed" in flags:  # the runner's own hidden flag
        flags.remove("--build-if-needed")
    missing = [f for f in flags if f not in accepted]
    assert not missing, f"{step.name}: {script.name} does not accept {missing}"


def test_every_test_a_stage_names_exists():
    """A lent GPU's minutes are too few to learn there that a test was renamed: every test file
    and test a step names must collect here (collection needs no GPU)."""
    named = sorted({a for stage in session.STAGES.values() for step in stage for a in step.argv
                    if a.startswith("tests/") or a.startswith("--ignore=tests/")})
    paths = [a.removeprefix("--ignore=") for a in named]
    assert any("::" in a for a in paths), "no stage names a single test: this check would prove nothing"
    for a in paths:
        assert (ROOT / a.split("::")[0]).is_file(), a
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        *[a for a in paths if "::" in a]], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    for a in paths:
        if "::" in a:
            assert a in p.stdout, f"{a} collected nothing:\n{p.stdout[-2000:]}"


def test_a_stage_runs_every_step_and_records_each(tmp_path, monkeypatch):
    py = ("{py}", "-c")
    monkeypatch.setitem(session.STAGES, "toy", (
        session.Step("fails", (*py, "import sys; print('bad'); sys.exit(3)"), 1, 30),
        session.Step("passes", (*py, "open(r'{out}/made.json', 'w').write('{}')"), 1, 30),
        session.Step("too_slow", (*py, "import time; time.sleep(30)"), 1, 1),
        session.Step("no_room", (*py, "pass"), 10_000, 10_000),
    ))
    rc = session.main(["--stage", "toy", "--out", str(tmp_path)])
    assert rc == 1
    summary = json.loads((tmp_path / "toy" / "summary.json").read_text())
    outcomes = {s["step"]: s["outcome"] for s in summary["steps"]}
    assert outcomes == {"fails": "failed", "passes": "passed", "too_slow": "timed_out", "no_room": "skipped"}
    assert (tmp_path / "toy" / "made.json").exists(), "{out} is the stage's folder"
    assert "bad" in (tmp_path / "toy" / "fails.log").read_text()


def test_dry_run_and_list_run_nothing(tmp_path, capsys):
    assert session.main(["--stage", "check", "--dry-run", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "pytest" in printed and "probe_copy_paths.py" in printed
    assert not (tmp_path / "check").exists()
    assert session.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in session.STAGES)


def test_bad_arguments_are_refused(capsys):
    for argv in (["--stage", "nope"], [], ["--stage", "check", "--budget", "0"]):
        with pytest.raises(SystemExit) as e:
            session.main(argv)
        assert e.value.code == 2


def test_a_step_past_its_time_is_interrupted_first_so_it_can_report(tmp_path):
    # pytest prints its failures and writes its report on SIGINT; a SIGKILL leaves neither
    # (the first GPU session of 2026-11-26 lost the failures of a timed-out `pytest -m gpu` so).
    script = ("import sys, time\nprint('started', flush=True)\ntry:\n    time.sleep(60)\n"
              "except KeyboardInterrupt:\n    print('interrupted: report written')\n    sys.exit(2)\n")
    log_path = tmp_path / "step.log"
    with open(log_path, "wb") as log:
        # 5 s: the child must be past its start-up (slow on a loaded machine) when SIGINT comes
        rc = session.run_with_interrupt([sys.executable, "-c", script], log, timeout=5.0, grace_s=20)
    assert rc is None
    assert "interrupted: report written" in log_path.read_text()
    # the same from a process that ignores SIGINT, as a shell's background job does: the step
    # still gets it (the full suite run with `&` saw only "started" before this)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with open(log_path, "wb") as log:
            rc = session.run_with_interrupt([sys.executable, "-c", script], log, timeout=5.0, grace_s=20)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rc is None and "interrupted: report written" in log_path.read_text()
    with open(log_path, "wb") as log:  # one that ignores SIGINT is killed after the grace
        rc = session.run_with_interrupt([sys.executable, "-c", "import signal, time\n"
                                         "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"],
                                        log, timeout=0.5, grace_s=0.5)
    assert rc is None


def test_the_oom_crash_probe_says_so_where_there_is_no_gpu(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "probe_oom_crash.py"), "--out", str(tmp_path / "o.json")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "no CUDA device" in p.stdout
    assert not (tmp_path / "o.json").exists()
