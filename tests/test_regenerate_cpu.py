"""benchmarks/regenerate_cpu.py runs exactly the commands BENCHMARKS.md shows, one line per section.

Owns: the check that every section of BENCHMARKS.md but the GPU and history ones has a
**Regenerate** line, and that the commands those lines show, in the file's order, are the ones
``regenerate_cpu.py --dry-run`` lists, each under its section (so a new CPU section without a
command, or a command changed on one side only, fails here); and the script's own rules: quick
forms write to the scratch folder, the run stops at the first command that fails or whose JSON
records a failed path check, and refuses to overwrite results or to start without a package.
Invariants: nothing here runs a benchmark (the commands run are a few lines of ``python -c``);
the checker is first shown finding each kind of problem in a made-up file.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers.benchmarks import BENCH, load_script

ROOT = BENCH.parent
REGENERATE = "python benchmarks/regenerate_cpu.py --only "
EXEMPT = ("GPU figures", "History, not reproducible")  # recorded GPU runs; figures with no raw data
_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$")


def regenerate_lines(markdown: str) -> list[tuple[str, bool, list[str]]]:
    """Per ## / ### section, in order: (heading, exempt, [the text of each Regenerate bullet])."""
    out: list[tuple[str, bool, list[str]]] = []
    parent = ""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        m = _HEADING.match(line)
        if m:
            parent = m[2] if m[1] == "##" else parent
            out.append((m[2], parent.startswith(EXEMPT) or m[2].startswith(EXEMPT), []))
        elif line.startswith("- **Regenerate**") and out:
            text = [line]
            for more in lines[i + 1:]:
                if not more.startswith("  ") or not more.strip():
                    break
                text.append(more.strip())
            out[-1][2].append(" ".join(text))
    return out


def problems(markdown: str, listed: list[tuple[str, str, str]]) -> list[str]:
    """What does not agree between the file and the script's dry run ([(name, section, command)])."""
    found: list[str] = []
    shown: list[tuple[str, str]] = []
    names = {n: s for n, s, _ in listed}
    for heading, exempt, bullets in regenerate_lines(markdown):
        if exempt:
            continue
        if len(bullets) != 1:
            found.append(f"section {heading!r}: {len(bullets)} Regenerate lines (want 1)")
            continue
        spans = re.findall(r"`([^`]+)`", bullets[0])
        only = [s[len(REGENERATE):].split(",") for s in spans if s.startswith(REGENERATE)]
        commands = [s for s in spans if s.startswith("python benchmarks/") and not s.startswith(REGENERATE)]
        if len(only) != 1:
            found.append(f"section {heading!r}: its Regenerate line names no `{REGENERATE}NAME`")
            continue
        for n in only[0]:
            if n not in names:
                found.append(f"section {heading!r}: --only {n}: no such name in regenerate_cpu.py")
        mine = [n for n, s, _ in listed if s == heading]
        if commands and only[0] != mine:
            found.append(f"section {heading!r}: --only {','.join(only[0])} but the script's commands of the "
                         f"section are {','.join(mine)}")
        if not commands and (mine or not only[0]):
            found.append(f"section {heading!r}: shows no command")
        shown += [(heading, c) for c in commands]
    script = [(s, c) for _, s, c in listed]
    if shown != script:
        extra = [x for x in shown if x not in script]
        missing = [x for x in script if x not in shown]
        found.append(f"commands differ: in BENCHMARKS.md only {extra}; in regenerate_cpu.py only {missing}"
                     + ("" if extra or missing else "; the same commands in another order"))
    return found


def dry_run(*args: str) -> list[tuple[str, str, str]]:
    p = subprocess.run([sys.executable, str(BENCH / "regenerate_cpu.py"), "--dry-run", *args], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("# {date} = ")
    listed = []
    for head, body in zip(lines[1::2], lines[2::2]):
        m = re.fullmatch(r"(\S+) \[(.+)\]", head)
        assert m and body.startswith("    "), (head, body)
        listed.append((m[1], m[2], body.strip()))
    return listed


# -- the checker, on made-up files -----------------------------------------------------------------

MADE_UP = """# Benchmarks
## CPU one
- **Command**: `python benchmarks/a.py --note x`
- **Regenerate** (`python benchmarks/regenerate_cpu.py --only a`):
  `python benchmarks/a.py --out benchmarks/results/a-{date}.json`
### Predicted from it
- **Regenerate** (`python benchmarks/regenerate_cpu.py --only a`): the section above's command.
## GPU figures (H100, 2026-11-26)
### Eviction
- **Command**: `python benchmarks/b.py --backend cuda`
## History, not reproducible: first GPU figures
"""
LISTED = [("a", "CPU one", "python benchmarks/a.py --out benchmarks/results/a-{date}.json")]


def test_the_checker_sees_a_section_without_a_command_and_commands_that_differ():
    assert problems(MADE_UP, LISTED) == []
    new_section = MADE_UP + "## CPU two\n- **Command**: `python benchmarks/c.py`\n"
    assert problems(new_section, LISTED) == ["section 'CPU two': 0 Regenerate lines (want 1)"]
    changed = MADE_UP.replace("a-{date}.json`", "a-{date}.json --quick`")
    assert problems(changed, LISTED)[-1].startswith("commands differ: in BENCHMARKS.md only [('CPU one', ")
    unknown = MADE_UP.replace("--only a`): the", "--only b`): the")
    assert problems(unknown, LISTED) == ["section 'Predicted from it': --only b: no such name in regenerate_cpu.py"]
    no_name = MADE_UP.replace("- **Regenerate** (`python benchmarks/regenerate_cpu.py --only a`):\n", "- **Regenerate**:\n")
    assert problems(no_name, LISTED)[0] == ("section 'CPU one': its Regenerate line names no "
                                            "`python benchmarks/regenerate_cpu.py --only NAME`")
    gpu_only = MADE_UP.replace("## GPU figures (H100, 2026-11-26)", "## GPU run")
    assert problems(gpu_only, LISTED) == ["section 'GPU run': 0 Regenerate lines (want 1)",
                                          "section 'Eviction': 0 Regenerate lines (want 1)"]


# -- BENCHMARKS.md and the script ------------------------------------------------------------------

def test_every_cpu_section_of_benchmarks_md_has_the_scripts_commands():
    listed = dry_run()
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert problems(text, listed) == []
    cpu = [h for h, exempt, _ in regenerate_lines(text) if not exempt]
    assert len(cpu) >= 14 and {s for _, s, _ in listed} <= set(cpu)
    rc = load_script("regenerate_cpu")
    assert [(c.name, c.section, c.command) for c in rc.COMMANDS] == listed
    for _, _, command in listed:  # every result it writes is dated, under benchmarks/results/
        if " --compare " in command:  # reads two results, writes none
            continue
        outs = re.findall(r"--(?:out|chart) (\S+)", command)
        assert outs and all(o == "{heldout}" or (o.startswith("benchmarks/results/") and "{date}" in o) for o in outs)


def test_quick_lists_a_quick_form_or_a_reason_for_every_command():
    rc = load_script("regenerate_cpu")
    p = subprocess.run([sys.executable, str(BENCH / "regenerate_cpu.py"), "--dry-run", "--quick"], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0
    for c in rc.COMMANDS:
        assert f"{c.name} [{c.section}]" in p.stdout
        assert (c.quick is not None and c.quick in p.stdout) or (c.quick is None and c.skip_quick in p.stdout)


def test_quick_writes_only_to_the_scratch_folder(tmp_path):
    rc = load_script("regenerate_cpu")
    cmd = rc.BY_NAME["trace_compare"].command
    argv = rc.argv_of(cmd, date="2031-01-02", heldout=tmp_path / "h", scratch=tmp_path)
    assert argv[0] == sys.executable
    assert argv[-2:] == ["benchmarks/results/trace-host-before-2026-11-26.json",  # read, not written: kept
                         str(tmp_path / "trace-host-after-2031-01-02.json")]
    argv = rc.argv_of(rc.BY_NAME["sim_heldout"].command, date="2031-01-02", heldout=tmp_path / "h", scratch=None)
    assert argv[-4:] == ["--trace", str(tmp_path / "h"), "--out", "benchmarks/results/sim_torch_allocator-heldout-2031-01-02.json"]


# -- running: stop at the first failure ------------------------------------------------------------

def fake(name: str, code: str, out: Path | None = None, needs: tuple[str, ...] = ()):
    rc = load_script("regenerate_cpu")
    text = f'python -c "{code}"' + (f" --out {out}" if out else "")
    return rc.Command(name, "made up", text, text, needs=needs, quick_needs=needs)


def run(commands, tmp_path, **kw):
    rc = load_script("regenerate_cpu")
    said: list[str] = []
    args = {"quick": False, "date": "2031-01-02", "heldout": tmp_path, "scratch": None, "overwrite": False,
            "keep_going": False, "dry_run": False, **kw}
    return rc.run(commands, echo=said.append, **args), "\n".join(said)


def test_the_run_stops_at_a_command_that_fails(tmp_path):
    marker = tmp_path / "ran.json"
    after = fake("after", "import sys; open(sys.argv[2], 'w').write('{}')", marker)
    code, said = run([fake("fails", "import sys; sys.exit(1)"), after], tmp_path)
    assert code == 1 and "fails: exited 1" in said and not marker.exists()
    code, said = run([fake("fails", "import sys; sys.exit(1)"), after], tmp_path, keep_going=True)
    assert code == 1 and marker.exists() and "== after: ok" in said


def test_a_json_whose_path_check_failed_stops_the_run(tmp_path):
    out = tmp_path / "x.json"
    write = ("import sys, json; json.dump({'path_checked': {'passed': False, 'failures': "
             "['python_api map 2 MiB x1: not the map path']}}, open(sys.argv[2], 'w'))")
    code, said = run([fake("bench", write, out), fake("next", "print('never')")], tmp_path)
    assert code == 1 and "not the map path" in said and "never" not in said


def test_it_refuses_before_running_anything(tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    marker = tmp_path / "ran.json"
    first = fake("first", "import sys; open(sys.argv[2], 'w').write('{}')", marker)
    code, said = run([first, fake("old", "pass", existing)], tmp_path)
    assert code == 2 and "old.json exists" in said and not marker.exists()
    code, said = run([first, fake("needy", "pass", needs=("no_such_package_here",))], tmp_path)
    assert code == 2 and "needs no_such_package_here" in said and not marker.exists()
    code, _ = run([first, fake("old", "pass", existing)], tmp_path, overwrite=True)
    assert code == 0 and marker.exists()
