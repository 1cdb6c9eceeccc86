"""Every code block of README.md, docs/*.md, RELIABILITY.md and BENCHMARKS.md runs as written.

Owns: running the docs' ``python``/``bash``/``sh`` blocks (tests/helpers/doc_blocks.py says how a
block is marked as needing a GPU or not to be run, with a reason), parsing their ``json``
blocks, and the rules that keep the docs about this repository (no path outside it, no
project-history issue numbers, no per-user paths).
Invariants: each block runs in its own subprocess, process group and temporary directory, with
its own runtime directory (so a daemon a block starts gets a private socket), under a timeout;
whatever the block left running is killed with its process group, pass or fail. A failure
names the file and line of the block's opening fence.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from helpers.doc_blocks import DOC_FILES, GPU_MARK, ROOT, RUNNABLE, Block, doc_blocks

BLOCKS = doc_blocks()
RUN = [b for b in BLOCKS if b.lang in RUNNABLE]
BLOCK_TIMEOUT_S = 60.0


def _param(b: Block):
    marks = [pytest.mark.gpu] if b.needs_gpu else []
    return pytest.param(b, id=f"{b.where}-{b.lang}", marks=marks)


def _env(tmp: Path) -> dict[str, str]:
    """The user's environment less vtalloc's own settings, with a private runtime directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VTALLOC_")}
    run = tmp / "run"
    run.mkdir(mode=0o700)
    env.update(XDG_RUNTIME_DIR=str(run), MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    return env


READY_TIMEOUT_S = 30.0


class _Output:
    """Reads a process's output on a thread (so a wait never blocks on the pipe) and notes the
    daemon's JSON ready line when one goes by."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        with stream:
            for line in stream:
                self.lines.append(line)
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("event") == "ready":
                    self.ready.set()

    def text(self) -> str:
        self._thread.join(timeout=5)
        return "".join(self.lines)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _start_daemon(cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """A host-backend daemon on the default socket of ``env``, for blocks marked with-daemon."""
    proc = subprocess.Popen(["vtalloc", "serve", "--backend", "host", "--capacity", "1GiB"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = _Output(proc)
    if not out.ready.wait(READY_TIMEOUT_S):
        _kill_group(proc)
        pytest.fail(f"the daemon for a with-daemon block did not get ready:\n{out.text()[-4000:]}")
    return proc


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM, as systemd or Ctrl-C stops a daemon; its exit status (-1 if it did not stop)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
        return proc.returncode
    except subprocess.TimeoutExpired:
        return -1
    finally:
        _kill_group(proc)


def run_block(block: Block, timeout_s: float = BLOCK_TIMEOUT_S) -> tuple[int, str, float]:
    """Run ``block`` as a user would paste it; return (exit status, its output, seconds).

    A ``daemon`` block must print the ready line and then exit 0 on SIGTERM (its status is what
    is returned); a ``with-daemon`` block gets a daemon started first."""
    tmp = Path(tempfile.mkdtemp(prefix="vtdoc"))   # short: Unix socket paths are limited to 107 bytes
    env = _env(tmp)
    daemon = _start_daemon(tmp, env) if block.mode == "with-daemon" else None
    try:
        if block.lang == "python":
            script, argv = tmp / "block.py", [sys.executable, "block.py"]
        elif block.mode == "daemon":  # one command: exec'd, so SIGTERM reaches the daemon itself
            script, argv = tmp / "block.sh", ["bash", "-c", "exec " + block.code.strip()]
        else:
            script, argv = tmp / "block.sh", ["bash", "-eo", "pipefail", "block.sh"]
        script.write_text(block.code)
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        out = _Output(proc)
        try:
            if block.mode == "daemon":
                if not out.ready.wait(READY_TIMEOUT_S):
                    _kill_group(proc)
                    proc.wait()
                    return -1, out.text() + "\n[no ready line]", time.monotonic() - t0
                return _stop(proc), out.text(), time.monotonic() - t0
            proc.wait(timeout=timeout_s)
            return proc.returncode, out.text(), time.monotonic() - t0
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.wait()
            return -1, out.text() + f"\n[timed out after {timeout_s:g} s]", time.monotonic() - t0
        finally:
            _kill_group(proc)  # a daemon or client the block left behind dies with its group
    finally:
        if daemon is not None:
            _stop(daemon)
        shutil.rmtree(tmp, ignore_errors=True)


_INSTALLS = re.compile(r"\bpip3?\s+install\b|\bapt(-get)?\s+install\b")


@pytest.mark.parametrize("block", [_param(b) for b in RUN])
def test_doc_block_runs(block: Block):
    if block.skip_reason is not None:
        pytest.skip(f"{block.where}: {block.skip_reason}")
    if _INSTALLS.search(block.code):
        pytest.fail(f"{block.where} installs packages: the tests do not run it; mark it <!-- doc-test: skip: ... -->")
    rc, out, seconds = run_block(block)
    if rc != 0:
        pytest.fail(f"the {block.lang} block at {block.where} exited {rc} after {seconds:.1f} s:\n{out[-6000:]}")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in BLOCKS if b.lang == "json"])
def test_doc_json_block_parses(block: Block):
    try:
        json.loads(block.code)
    except json.JSONDecodeError as e:
        pytest.fail(f"the json block at {block.where} does not parse: {e}")


def test_skip_marks_carry_a_reason_and_sit_on_runnable_blocks():
    for b in BLOCKS:
        if b.skip_reason is not None:
            assert b.skip_reason, f"{b.where}: a doc-test skip needs a reason"
            assert b.lang in RUNNABLE, f"{b.where}: a skip mark on a {b.lang or 'plain'} block, which never runs"
            assert not b.needs_gpu, f"{b.where}: marked both as needing a GPU and as skipped"


def test_interpreter_sessions_are_pycon_not_python():
    """A ``>>>`` prompt cannot run as a script: such a block is labelled pycon (shown, not run)."""
    bad = [b.where for b in BLOCKS if b.lang in RUNNABLE and re.search(r"^\s*>>> ", b.code, re.M)]
    assert not bad, f"blocks with >>> prompts labelled as scripts: {bad}"


def test_the_docs_are_found_and_cpu_blocks_are_most():
    """The extractor sees the blocks (a broken fence regex would make every test above vacuous)."""
    assert {"README.md", "docs/service.md", "docs/eviction.md", "docs/torch.md"} <= set(DOC_FILES)
    cpu = [b for b in RUN if not b.needs_gpu and b.skip_reason is None]
    assert len([b for b in cpu if b.lang == "python"]) >= 8, [b.where for b in cpu]
    assert any(b.path == "README.md" and "vtalloc serve" in b.code for b in cpu), "the README's service example runs"


def test_gpu_blocks_are_skipped_here_for_that_reason(request):
    """Without a CUDA device a GPU-marked block is skipped by the gpu marker (tests/conftest.py), saying why."""
    from vtalloc.allocator import backend_available

    gpu = [b for b in RUN if b.needs_gpu]
    assert gpu, f"no block carries {GPU_MARK!r}"
    ok, why = backend_available("cuda")
    if ok:
        pytest.skip("a CUDA device is here: the GPU blocks run")
    assert why


def test_the_runner_catches_a_failing_and_a_hanging_block():
    """The runner really fails: a block that exits 1 and one that hangs are both caught."""
    rc, out, _ = run_block(Block("README.md", 7, "python", "import sys\nprint('x')\nsys.exit(1)\n", None))
    assert rc == 1 and "x" in out
    rc, out, seconds = run_block(Block("README.md", 9, "bash", "sleep 30 &\nsleep 30\n", None), timeout_s=1.0)
    assert rc == -1 and "timed out" in out and seconds < 10


# -- what the docs may say ---------------------------------------------------------------------
_OUTSIDE = re.compile(r"\.\./shared|/work/|/run/user/\d+")
# "issue 12" is the project's history, not the software; PyTorch's issues are references.
_ISSUE = re.compile(r"(?<!PyTorch )\bissues? \d+", re.I)


@pytest.mark.parametrize("rel", DOC_FILES)
def test_docs_speak_of_this_repository(rel: str):
    text = (ROOT / rel).read_text(encoding="utf-8")
    bad = [(n, line) for n, line in enumerate(text.splitlines(), 1) if _OUTSIDE.search(line) or _ISSUE.search(line)]
    assert not bad, f"{rel}: lines naming paths outside the repository, per-user paths or project issues: {bad}"


def test_service_examples_find_the_daemon_without_xdg_runtime_dir(monkeypatch):
    """The README's and docs/service.md's clients pass no address: the client's default must be
    the daemon's default socket also where XDG_RUNTIME_DIR is unset (it once became
    unix:///vtalloc/vtalloc.sock there)."""
    from vtalloc.allocator.runtime_dir import runtime_dir
    from vtalloc.server.protocol.address import default_socket_path

    for var in ("XDG_RUNTIME_DIR", "VTALLOC_RUNTIME_DIR", "VTALLOC_SOCKET"):
        monkeypatch.delenv(var, raising=False)
    path = default_socket_path()
    expected = "/run/vtalloc" if os.geteuid() == 0 else f"{tempfile.gettempdir()}/vtalloc-{os.geteuid()}"
    assert path == f"{expected}/vtalloc.sock" and Path(path).parent == runtime_dir()
    examples = [b for b in RUN if b.path in ("README.md", "docs/service.md") and "ServiceAddressSpace(" in b.code]
    assert examples and all("ServiceAddressSpace()" in b.code for b in examples), [b.where for b in examples]
