"""One torch allocation body behind both ABIs (issue 41).

vta_torch_alloc (the pluggable allocator, csrc/torch/torch_shim.cpp) and vta_torch_malloc (the
torch-native ABI, csrc/torch/torch_native.cpp) each ran the same steps (checks, context, space,
parked frees, capture refusal, placement, failure record); they now both call torch_allocate
(csrc/torch/torch_allocate.cpp). These tests hold that: the entry points place nothing
themselves, and a failure is recorded alike whichever ABI saw it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vtalloc.allocator import Config, InvalidArgumentError, OutOfMemoryError
from vtalloc.allocator.torch import native_abi as native
from vtalloc.allocator.torch import shim
from helpers.sizes import MiB

TORCH = Path(__file__).resolve().parents[1] / "csrc" / "torch"
PLACES = re.compile(r"(\.|->)malloc\(")  # a block placed in a space or a graph-private pool


def _body(source: str, name: str) -> str:
    """The text of function `name` in `source` (from its signature to its closing brace)."""
    start = source.index(f" {name}(")
    depth, i = 0, source.index("{", start)
    for j in range(i, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return source[start:j + 1]
    raise AssertionError(f"{name}: no closing brace")


def test_both_entry_points_call_the_one_body_and_place_nothing_themselves():
    entries = {"torch_shim.cpp": "vta_torch_alloc", "torch_native.cpp": "vta_torch_malloc"}
    for file, name in entries.items():
        body = _body((TORCH / file).read_text(), name)
        assert "torch_allocate(" in body, f"{name} does not call torch_allocate"
        assert not PLACES.search(body), f"{name} places a block itself"
        for step in ("space_for(", "stream_capturing(", "record_failure(", "current_region("):
            assert step not in body, f"{name} repeats a step of torch_allocate: {step}"
    # Only the body (and the pools it asks) places a torch allocation in csrc/torch/.
    placing = sorted(p.name for p in TORCH.glob("*.cpp") if PLACES.search(p.read_text()))
    assert placing == ["private_pools.cpp", "torch_allocate.cpp"]


@pytest.fixture
def host():
    shim.configure(Config(backend="host", capacity=16 * MiB, page_size=2 * MiB), shim.FAIL_RETURN_NULL)
    yield
    shim.release()


def test_a_failure_is_recorded_alike_whichever_abi_saw_it(host):
    # Out of memory: the same message and counters from both.
    assert shim.alloc_for_test(64 * MiB, device=0) == 0
    pluggable = shim.failures(0)
    with pytest.raises(OutOfMemoryError) as raised:
        native.malloc(64 * MiB, device=0)
    both = shim.failures(0)
    assert pluggable.ooms == 1 and pluggable.alloc_failures == 1
    assert both.ooms == 2 and both.alloc_failures == 2
    assert both.last_message == pluggable.last_message and pluggable.last_message in str(raised.value)
    assert pluggable.last_message.startswith("CUDA out of memory (vtalloc, device 0)")
    # A refused request: the same "could not allocate" record from both.
    huge = 1 << 62
    assert shim.alloc_for_test(huge, device=1) == 0
    first = shim.failures(1).last_message
    with pytest.raises(InvalidArgumentError):
        native.malloc(huge, device=1)
    second = shim.failures(1)
    assert second.alloc_failures == 2 and second.last_message == first
    assert first.startswith(f"vtalloc could not allocate {huge} bytes on device 1: ")
