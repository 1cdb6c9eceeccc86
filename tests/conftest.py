"""Test-wide rules: GPU tests skip only when no CUDA device/driver is found, every test ends
with nothing held (no page, mapping, reservation, pinned byte, event or stream), no test
touches an unmapped address through the host backend unless marked ``host_faults`` (its
fault guard counts such an access instead of crashing, so without this rule a bug that used to
kill the test would pass), under CI (CI=true) hypothesis runs derandomized, and the terminal
size is the one a user's shell gives (pytest-xdist's workers set COLUMNS=80 and LINES=24, which
the CLI's console would read once at import and keep).

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

# Before anything imports the CLI: its console takes COLUMNS at construction, so a worker's 80
# would override the width each test asks for (tests/test_cli.py sets COLUMNS per command).
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

from vtalloc.allocator import backend_available, global_counters
from vtalloc.allocator._native import guarded_fault_totals


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
    """Invariant 5: after each test every counter of what the backends hold is back to 0.
    Only a test that ends with something held pays for a full garbage collection (objects in
    reference cycles are freed only by one) before the counters are judged: with torch and its
    compiler loaded a collection takes about 0.5 s, and collecting after every test was 40% of
    the suite's time. A test that ends with the counters at 0 holds nothing, whatever garbage
    it left, so skipping the collection there cannot hide a leak."""
    yield

    def held() -> dict[str, int]:
        return {k: v for k, v in global_counters().items() if v}

    left = held()
    if left:
        gc.collect()
        left = held()
    assert not left, f"resources still held after the test: {left}"


@pytest.fixture(autouse=True)
def no_unexpected_faults(request):
    """A copy or test kernel that hit an unmapped address on the host backend is a bug (on a GPU
    an illegal address kills the context) unless the test is marked host_faults."""
    before = guarded_fault_totals()
    yield
    if request.node.get_closest_marker("host_faults") is None:
        kernels, copies = (after - b for after, b in zip(guarded_fault_totals(), before))
        assert (kernels, copies) == (0, 0), (
            f"{kernels} test kernel(s) and {copies} backend copies touched an unmapped address on the host "
            "backend; mark the test host_faults if it does so on purpose"
        )
