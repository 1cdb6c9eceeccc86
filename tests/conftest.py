"""Test-wide rules: GPU tests skip only when no CUDA device/driver is found, every test ends
with nothing held (no page, mapping, reservation, pinned byte, event or stream), and under CI
(CI=true) hypothesis runs derandomized.

Shared helpers live in tests/helpers/, never here.
"""

from __future__ import annotations

import gc
import os

import pytest
from hypothesis import settings

# CI replays the same examples every run (a red CI must mean a change broke something, not
# that a random draw found an old bug); local runs keep exploring new examples.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

from vtalloc.allocator import backend_available, global_counters


def pytest_collection_modifyitems(config, items):
    ok, why = backend_available("cuda")
    if ok:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def nothing_leaks():
    """Invariant 5: after each test every counter of what the backends hold is back to 0."""
    yield
    gc.collect()
    left = {k: v for k, v in global_counters().items() if v}
    assert not left, f"resources still held after the test: {left}"
