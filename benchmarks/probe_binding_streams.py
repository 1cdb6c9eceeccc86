"""Why a number written into a C++ stream by vtalloc's torch binding crashed the process, on a GPU.

On the H200 of 2026-11-28 every out-of-memory under ``enable()`` with the torch-native binding
was a SIGSEGV in ``std::ostream::_M_insert<long>`` (via ``c10::str`` in the binding's OOM
message), while torch's own errors, which format the same numbers inside libc10, and the
pluggable binding (which formats none) raised cleanly. This probe gathers the evidence for
docs/design.md ("No iostreams in the core or the binding"), each case in a fresh interpreter:

* the toolchain and runtime: the g++ that builds the binding, the libstdc++ a torch process
  loads, the GCC torch's libraries were built with, and whether they define (export) any
  iostream/locale symbol of their own;
* three tiny libraries built as the binding is (``-O2 -shared``, linked to torch's libc10):
  one writes a number into an ``std::ostringstream``, one only a string, one calls
  ``c10::str("n=", 42)``; each called after ``import torch`` and CUDA's initialisation, where
  it dies or returns, with ``LD_DEBUG=bindings`` saying which library each stream symbol bound to;
* with ``--old-binding DIR`` (the binding's sources before the fix), that binding built and
  made to raise an OOM (expected to crash), and the current one (expected to raise).

Owns: the evidence, in one JSON. Measures nothing; changes nothing of the machine's.
Invariants: every case runs in its own process with a time limit; a case that cannot be built
or run says why in its record; exits 0 whatever the cases showed, 2 without a GPU.

    python benchmarks/probe_binding_streams.py --out "$OUT/binding_streams.json" [--old-binding DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PROBES = {
    "number": '#include <sstream>\nextern "C" int probe() { std::ostringstream s; s << 42L; return (int)s.str().size(); }\n',
    "text": '#include <sstream>\nextern "C" int probe() { std::ostringstream s; s << "forty-two"; return (int)s.str().size(); }\n',
    "c10_str": '#include <c10/util/StringUtil.h>\nextern "C" int probe() { return (int)c10::str("n=", 42).size(); }\n',
}

CALL = """
import ctypes, json, sys
import torch
if sys.argv[2] == "cuda":
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
lib = ctypes.CDLL(sys.argv[1])
print(json.dumps({"returned": lib.probe()}))
"""

OOM = """
import json, sys
from pathlib import Path
import torch
from vtalloc.allocator.torch import binding_build
if sys.argv[1] != "current":  # the sources before the fix: build them as they were, unchecked
    binding_build._source_root = lambda: Path(sys.argv[1])
    binding_build.number_formatting_symbols = lambda library: ()
import vtalloc.allocator.torch as vt
vt.enable(binding="native", capacity="1GiB")
try:
    torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    print(json.dumps({"raised": None}))
except torch.OutOfMemoryError as e:
    print(json.dumps({"raised": "torch.OutOfMemoryError", "message": str(e)[:300]}))
"""

STD_OWN = re.compile(r"_Z(N|NK|TV|TI|TS|TT)?S[tiod]")
STREAM_SYMBOL = re.compile(r"_M_insert|ostringstream|basic_ios|St6locale|num_put|ios_base")


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def run_case(argv: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    full = dict(os.environ, PYTHONFAULTHANDLER="1", **(env or {}))
    try:
        p = sh(argv, env=full, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ended": "timeout"}
    out = {"returncode": p.returncode, "ended": "signal" if p.returncode < 0 else "exit"}
    lines = p.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        out["result"] = json.loads(lines[-1])
    out["stderr_tail"] = [ln for ln in p.stderr.splitlines() if not ln.startswith(" ") or "File" in ln][-12:]
    return out


def bindings_of(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The LD_DEBUG=bindings lines for stream symbols bound from the probe library."""
    with tempfile.TemporaryDirectory() as tmp:
        run_case(argv, env={**(env or {}), "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": f"{tmp}/ld"})
        lines = []
        for f in Path(tmp).glob("ld*"):
            lines += [ln.split(":", 1)[-1].strip() for ln in f.read_text(errors="replace").splitlines()
                      if "probe_" in ln and STREAM_SYMBOL.search(ln)]
    return sorted(set(lines))[:40]


def toolchain(torch_lib: Path) -> dict:
    from vtalloc.allocator.elf_symbols import is_iostream_or_locale, symbols

    maps = run_case([sys.executable, "-c", "import torch, json; print(json.dumps({'maps': sorted({l.split()[-1] for l in "
                     "open('/proc/self/maps') if 'libstdc++' in l or 'libgcc_s' in l})}))"])
    out = {"gxx": sh(["g++", "--version"]).stdout.splitlines()[:1], "loaded_by_torch": maps.get("result"),
           "torch_lib": str(torch_lib), "defines_iostream_or_locale": {}}
    for name in ("libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch_python.so"):
        path = torch_lib / name
        if path.exists():
            # std's own iostream/locale code defined in torch's library (a static copy), not
            # torch's functions that merely take a stream, nor <regex>'s templates
            defined = [s.name for s in symbols(str(path)) if s.defined and is_iostream_or_locale(s.name)
                       and STD_OWN.match(s.name) and "regex" not in s.name and "_detail" not in s.name]
            gcc = sorted(set(re.findall(r"GCC: \([^)]*\) [\d.]+", path.read_bytes()[-4_000_000:].decode("latin-1"))))
            out["defines_iostream_or_locale"][name] = {"count": len(defined), "examples": defined[:8], "gcc": gcc}
    return out


def build_probe(name: str, source: str, torch: object, tmp: Path) -> Path | str:
    from vtalloc.allocator.torch import binding_build

    includes, lib = binding_build._torch_dirs(torch)
    src = tmp / f"probe_{name}.cpp"
    src.write_text(source)
    so = tmp / f"probe_{name}.so"
    cmd = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-DNDEBUG",
           f"-D_GLIBCXX_USE_CXX11_ABI={binding_build._cxx11_abi(torch)}", *[f"-isystem{d}" for d in includes],
           str(src), "-o", str(so), f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}"]
    p = sh(cmd)
    return so if p.returncode == 0 else f"build failed: {p.stderr[-600:]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--old-binding", help="a folder holding torch_binding/ and include/ of the sources before the fix")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to probe")
        return 2
    record: dict = {"probe": "binding_streams", "torch": torch.__version__,
                    "toolchain": toolchain(Path(torch.__file__).parent / "lib"), "probes": {}, "oom": {}}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for name, source in PROBES.items():
            so = build_probe(name, source, torch, tmp)
            if isinstance(so, str):
                record["probes"][name] = {"error": so}
                continue
            call = [sys.executable, "-c", CALL, str(so)]
            record["probes"][name] = {"after_import_torch": run_case(call + ["import"]),
                                      "after_cuda_init": run_case(call + ["cuda"]),
                                      "bindings": bindings_of(call + ["cuda"])}
            print(name, {k: v.get("ended") if isinstance(v, dict) else len(v) for k, v in record["probes"][name].items()},
                  flush=True)
        env = {"VTALLOC_CACHE_DIR": str(tmp / "cache")}
        cases = {"current": "current"}
        if a.old_binding:
            cases["before_fix"] = str(Path(a.old_binding).resolve())
        for label, root in cases.items():
            record["oom"][label] = run_case([sys.executable, "-c", textwrap.dedent(OOM), root], env=env, timeout=240)
            print("oom", label, record["oom"][label].get("ended"), record["oom"][label].get("returncode"), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
