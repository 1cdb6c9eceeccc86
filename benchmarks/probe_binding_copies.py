"""Whether the torch binding carries its own copies of libstdc++'s stream templates, and what fixes it.

On the H200 image of 2026-11-28 (Ubuntu's g++ 13.3, libstdc++ 6.0.33, torch 2.11.0+cu130) the
binding as built *defines* std::num_put's members and the guard of its facet id
(``_ZGVNSt7num_put...2idE``), where the same sources built on Debian's g++ 12 only import them,
and a toy library formatting a number through a stream after CUDA's initialisation did not crash
(probe_binding_streams.py). A second ``num_put::id`` that wins the binding's own lookups would
send its facet lookups to another facet (the crash's frame #0 was ``codecvt<char16_t>::do_unshift``).
This probe says, on such a machine:

* the compiler's predefined macros that decide libstdc++'s explicit instantiation declarations
  (_GLIBCXX_ASSERTIONS, _GLIBCXX_EXTERN_TEMPLATE's inputs, _FORTIFY_SOURCE, ...);
* per binding source, built as build() does (and with -U_GLIBCXX_ASSERTIONS), the iostream and
  locale symbols it defines and the functions that refer to them;
* an OOM under the binding (the check on numbers bypassed) before and after the fix of the
  sources, with and without the process's libstdc++ made global before the binding is loaded.

Owns: the evidence, in one JSON. Changes nothing of the machine's. Exits 0, 2 without a GPU.

    python benchmarks/probe_binding_copies.py --old-binding DIR --out "$OUT/binding_copies.json"
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from probe_binding_streams import run_case

OOM = """
import ctypes, json, os, sys
from pathlib import Path
import torch
from vtalloc.allocator.torch import binding_build
binding_build.number_formatting_symbols = lambda library: ()
if sys.argv[1] != "current":
    binding_build._source_root = lambda: Path(sys.argv[1])
if sys.argv[2] == "local":
    binding_build.share_cxx_runtime = lambda: None
extra = sys.argv[3].split() if len(sys.argv) > 3 and sys.argv[3] else []
if extra:
    args = binding_build._compile_args
    binding_build._compile_args = lambda *a, **k: args(*a, **k) + extra
import vtalloc.allocator.torch as vt
vt.enable(binding="native", capacity="1GiB")
out = {"binding": str(vt.binding().library)}
try:
    torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    out["raised"] = None
except torch.OutOfMemoryError as e:
    out.update(raised="torch.OutOfMemoryError", message=str(e)[:200])
x = torch.ones(1000, device="cuda")
out["after"] = float(x.sum().item())
print(json.dumps(out))
"""


def sh(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def per_object(extra: list[str], root: Path | None = None) -> dict:
    import torch
    from vtalloc.allocator.elf_symbols import is_iostream_or_locale, symbols
    from vtalloc.allocator.torch import binding_build

    if root is not None:
        binding_build._source_root = lambda: root
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        shim = Path(tmp) / "c10" / "cuda" / "impl"  # a CPU-only torch lacks this generated header
        shim.mkdir(parents=True)
        (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        args = binding_build._compile_args(torch, binding_build.cuda_include_dirs(None, torch.version.cuda),
                                           extra_includes=[tmp]) + extra
        for src in binding_build.source_files():
            if src.suffix != ".cpp":
                continue
            obj = Path(tmp) / f"{src.stem}.o"
            p = sh(["g++", "-O2", "-c", *args, str(src), "-o", str(obj)])
            if p.returncode:
                out[src.name] = {"error": p.stderr[-500:]}
                continue
            defined = sorted({s.name for s in symbols(str(obj), table="static") if s.defined and
                              is_iostream_or_locale(s.name) and re.match(r"_Z(N|NK|TV|TI|TS|TT|GV)?(S[tiod]|N?St)", s.name)})
            dis = sh(["bash", "-c", f"objdump -dr --no-show-raw-insn {obj} | c++filt"]).stdout
            users, fn = set(), ""
            for line in dis.splitlines():
                m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
                if m:
                    fn = m.group(1)
                elif re.search(r"num_put|ostringstream|basic_ios|_M_insert|locale::id", line) and fn:
                    users.add(fn[:160])
            out[src.name] = {"defines": defined[:30], "defines_count": len(defined), "referring_functions": sorted(users)[:30]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--old-binding", required=True)
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    macros = sh(["bash", "-c", "g++ -dM -E -x c++ -std=c++17 - </dev/null"]).stdout.splitlines()
    record: dict = {
        "probe": "binding_copies",
        "predefined": sorted(m for m in macros if re.search(r"GLIBCXX|FORTIFY|ASSERT|__GNUC__|PIE|PIC", m)),
        "gxx_specs_flags": sh(["bash", "-c", "g++ -v -O2 -x c++ -c /dev/null -o /dev/null 2>&1 | grep cc1plus"]).stdout[-1500:],
        "objects": {"as_built": per_object([]), "undef_assertions": per_object(["-U_GLIBCXX_ASSERTIONS"])},
        "oom": {},
    }
    print(json.dumps({k: {f: v.get("defines_count") for f, v in o.items()} for k, o in record["objects"].items()}),
          flush=True)
    old = str(Path(a.old_binding).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("current", "local", ""), ("current", "shared", ""), ("current", "local", "-U_GLIBCXX_ASSERTIONS"),
                 ("old", "local", ""), ("old", "shared", ""), ("old", "local", "-U_GLIBCXX_ASSERTIONS")]
        for i, (src, runtime, extra) in enumerate(cases):
            env = {"VTALLOC_CACHE_DIR": f"{tmp}/c{i}"}
            r = run_case([sys.executable, "-c", textwrap.dedent(OOM), "current" if src == "current" else old, runtime,
                          extra], env=env, timeout=200)
            key = f"{src}/{runtime}/{extra or 'as_built'}"
            record["oom"][key] = r
            print(key, r.get("ended"), r.get("returncode"), (r.get("result") or {}).get("raised"), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
