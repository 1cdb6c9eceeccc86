"""Memory on real models' allocation traces (benchmarks/traces/, docs/design.md "Blocks share
pages"): at default settings, a stored training-step trace (forward, backward, AdamW) replays
with no OOM at a capacity of peak live bytes + max(2%, 4 pages), and at 4x peak live it maps at
most 1.25x peak live. tiny_gpt2 (a 2-layer GPT-2) is the small one; vit (ViT-B/16 at batch 8)
is the one whole-page rounding fails: 26.6% over peak live before pages were shared.

Owns: the CI check of those two bounds on stored traces, through bench_trace.py's own replay
(a few seconds each). The same bounds on every stored trace, with the driver calls and the
modeled H100 time, are what `benchmarks/bench_trace.py --compare` checks (BENCHMARKS.md).
Invariants: CPU only; every space is closed (conftest checks that nothing stays held).
"""

from __future__ import annotations

import pytest

from helpers.benchmarks import BENCH, load_script
from vtalloc.allocator import Config

bt = load_script("bench_trace")
CONFIG = Config(backend="host")
PAGE = 2 << 20
TRACES = ("tiny_gpt2", "vit")


@pytest.fixture(scope="module", params=TRACES)
def trace(request):
    t = bt.trace_format.load(BENCH / "traces" / f"{request.param}.json.gz")
    return t, bt.Compiled.of(t)


def test_the_stored_traces_are_the_ones_this_test_is_sized_for(trace):
    t, _ = trace
    assert t.num_allocs > 1000 and 64 << 20 < t.peak_live_bytes() < 2 << 30  # a few seconds per replay


def test_replays_with_no_oom_at_peak_live_plus_the_bound(trace):
    t, compiled = trace
    peak = t.peak_live_bytes()
    capacity = bt.bound_bytes(peak, PAGE) // PAGE * PAGE  # whole pages, at most the bound
    r = bt.replay_host(compiled, CONFIG, capacity)
    assert r.ok, f"OOM at event {r.oom_event} ({r.oom_size} B) at a capacity of {capacity} B, peak live {peak} B"
    assert r.peak_mapped_bytes <= capacity


def test_maps_at_most_1_25x_peak_live_at_a_generous_capacity(trace):
    t, compiled = trace
    peak = t.peak_live_bytes()
    r = bt.replay_host(compiled, CONFIG, -(-4 * peak // PAGE) * PAGE)
    assert r.ok
    assert r.peak_mapped_bytes <= 1.25 * peak, r.peak_mapped_bytes / peak
