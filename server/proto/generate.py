"""Regenerate, or check, the committed Python stubs of ``vtalloc/v1/*.proto``.

Owns: the one command that makes ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` beside
the .proto files. Invariants: it runs only under the pinned grpcio-tools (another version
would write different code and raise the runtime floors), and its output is a pure
function of the .proto files, so ``--check`` can compare byte for byte.

protoc writes imports from the proto path (``from vtalloc.v1 import pages_pb2``), but the
stubs live in the installed package ``vtalloc.server.proto.vtalloc.v1``; the only edit made
to protoc's output is rewriting those import lines to the package path. The version guards
in the generated code are left alone.

    python server/proto/generate.py           # rewrite the stubs
    python server/proto/generate.py --check   # exit 1 if the committed stubs are stale
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

# Keep in step with pyproject.toml: the `proto` extra pins this version, and the runtime
# floors (grpcio, protobuf) are the versions this generator writes into the stubs.
GRPCIO_TOOLS_VERSION = "1.85.1"

HERE = Path(__file__).resolve().parent
PROTO_PACKAGE_DIR = Path("vtalloc") / "v1"
PYTHON_PACKAGE = "vtalloc.server.proto.vtalloc.v1"
_IMPORT_RE = re.compile(r"^(from )vtalloc\.v1( import )", re.MULTILINE)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[Path]:
    return sorted((HERE / PROTO_PACKAGE_DIR).glob("*.proto"))


def _check_tools_version() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("grpcio-tools")
    except PackageNotFoundError:
        sys.exit(f"grpcio-tools is not installed: pip install 'grpcio-tools=={GRPCIO_TOOLS_VERSION}' (or .[proto])")
    if found != GRPCIO_TOOLS_VERSION:
        sys.exit(f"grpcio-tools {found} is installed, but the stubs are made with {GRPCIO_TOOLS_VERSION}")


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs for every .proto under ``out_dir/vtalloc/v1``; return their paths."""
    _check_tools_version()
    from grpc_tools import protoc

    rel = [str(p.relative_to(HERE)) for p in proto_files()]
    args = ["protoc", f"-I{HERE}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", *rel]
    if protoc.main(args) != 0:
        sys.exit("protoc failed (see above)")
    written = []
    for path in sorted((out_dir / PROTO_PACKAGE_DIR).iterdir()):
        if path.name.endswith(GENERATED_SUFFIXES):
            path.write_text(_IMPORT_RE.sub(rf"\g<1>{PYTHON_PACKAGE}\g<2>", path.read_text()))
            written.append(path)
    return written


def committed() -> dict[str, str]:
    d = HERE / PROTO_PACKAGE_DIR
    return {p.name: p.read_text() for p in sorted(d.iterdir()) if p.name.endswith(GENERATED_SUFFIXES)}


def stale_files() -> list[str]:
    """Names of stubs that regenerating would change, add or remove (empty: up to date)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_text() for p in generate(Path(tmp))}
    old = committed()
    return sorted(n for n in fresh.keys() | old.keys() if fresh.get(n) != old.get(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed stubs differ from a fresh run")
    args = ap.parse_args(argv)
    if args.check:
        stale = stale_files()
        if stale:
            print("stale generated stubs: " + ", ".join(stale) + "; run python server/proto/generate.py",
                  file=sys.stderr)
            return 1
        print("generated stubs are up to date")
        return 0
    for path in generate(HERE):
        print(f"wrote {path.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
