"""Loading a script of benchmarks/ as a module, for the tests of its functions.

Owns: BENCH (the folder) and load_script(), the one way tests import a benchmark script (a
script beside the package of its shared code, benchmarks/lib/, not a package module) or one of
those library modules ("lib.trace_format").
Invariants: a script is loaded once per name and registered in sys.modules first (its
dataclasses look their module up); the folder is on sys.path while it loads, so a script finds
its library (lib.trace_format, lib.provenance) as it does when run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def load_script(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `name` (the one loaded before, if any); a dotted name
    ("lib.path_check") is a library module, imported as the scripts import it."""
    if name in sys.modules:
        return sys.modules[name]
    if "." in name:
        sys.path.insert(0, str(BENCH))
        try:
            return importlib.import_module(name)
        finally:
            sys.path.remove(str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    added = str(BENCH) not in sys.path
    if added:
        sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        if added:
            sys.path.remove(str(BENCH))
    return mod
