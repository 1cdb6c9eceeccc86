"""vtalloc without its optional dependencies: a plain `pip install vtalloc` (no torch, no
cuda-python), as on a node that only runs the daemon.

Each check runs in a fresh interpreter in which importing torch or cuda-python fails as it
does where they are not installed (a meta-path finder refuses them), so whatever imports them
by accident fails here. The torch integration must then say what to install.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "cuda"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NotInstalled())
""")


def run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def test_the_core_the_daemon_and_the_cli_import_without_torch_or_cuda_python():
    r = run("""
        import vtalloc, vtalloc.allocator, vtalloc.allocator.torch, vtalloc.server.daemon, vtalloc.client.cli
        from vtalloc.allocator import AddressSpace
        with AddressSpace(backend="host", capacity="8MiB") as s:
            a = s.malloc(1 << 20); s.write(a, b"ok"); assert s.read(a, 2) == b"ok"; s.free(a)
        assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "cuda")]
        print("fine")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "fine", r.stderr


@pytest.mark.parametrize("args", [["info"], ["demo", "--backend", "host", "--no-train"], ["serve", "--help"]])
def test_the_cli_works_without_torch_or_cuda_python(args):
    r = run(f"""
        import sys
        from vtalloc.client.cli import main
        sys.argv = ["vtalloc", *{args!r}]
        main()
    """)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_the_torch_integration_names_what_it_needs():
    r = run("""
        from vtalloc.allocator import AddressSpace, MissingDependencyError
        import vtalloc.allocator.torch as vt
        for call in (vt.enable, vt.oom_exception, lambda: AddressSpace(backend="host", capacity="8MiB").tensor((4,))):
            try:
                call()
            except MissingDependencyError as e:
                assert isinstance(e, ImportError)
                print(e)
            else:
                raise SystemExit(f"{call} did not raise")
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 and all("vtalloc[torch]" in ln and "download.pytorch.org/whl/cpu" in ln for ln in lines)
    assert "space.tensor() needs torch" in lines[2]


def test_the_demo_says_what_training_needs():
    r = run("""
        import sys
        from vtalloc.client.cli import main
        sys.argv = ["vtalloc", "demo", "--backend", "host"]
        main()
    """)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    err = " ".join(r.stderr.split())  # rich wraps at 80 columns
    assert "--no-train skips it" in err and "vtalloc[torch]" in err
