"""benchmarks/record_trace.py on CPU, without transformers: its profiler path on a plain torch
model, its CUDA snapshot conversion on a synthetic snapshot, its CLI errors, and the stored traces.

Owns: the checks that a recorded training step is a valid trace whose frees pair with its
allocations (everything a step allocates it frees again) and whose saved marks name what autograd
saved, that trace_format's optional ``saved`` field round-trips and is validated, that
snapshot_to_events() maps streams,
finds the blocks that existed before the recording and frees at free_completed, that
``--model all`` still means the models of the stored traces (trace_models.STORED), and that every
file in benchmarks/traces/ loads, says how it was made, and has its row in
benchmarks/traces/README.md with its event count and peak live bytes.
Invariants: needs torch only (transformers is imported only by the model builders; the one test
that reaches them makes that import fail on purpose); CPU only, nothing here is marked gpu.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # record_trace imports trace_format and provenance, beside it

import record_trace as rt  # noqa: E402
from lib import trace_format  # noqa: E402
from lib import trace_models  # noqa: E402

MiB = 1 << 20


def _live_at_end(events) -> dict[int, int]:
    sizes = {}
    for e in events:
        if e[0] == "a":
            sizes[e[1]] = e[2]
        else:
            del sizes[e[1]]
    return sizes


def test_a_plain_models_training_steps_through_the_profiler():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))

    def make_batch(step: int) -> rt.Batch:
        g = torch.Generator().manual_seed(step)
        return {"x": torch.randn(32, 64, generator=g), "y": torch.randint(0, 10, (32,), generator=g)}

    def loss_fn(m: torch.nn.Module, b: rt.Batch) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(b["x"]), b["y"])

    events, stats = rt.record_steps_cpu(model, make_batch, loss_fn, steps=2)
    trace = trace_format.Trace("plain", "cpu-profiler", {}, {}, {}, trace_format.validate_events(events))
    params = sum(p.nbytes for p in model.parameters())
    # each parameter and its AdamW state (step, exp_avg, exp_avg_sq) open the trace: a storage each
    assert stats["initial_allocations"] == 4 * len(list(model.parameters()))
    assert stats["missed_frees"] == 0 and stats["running_total_mismatches"] == 0
    assert trace.num_frees > 10 and trace.num_allocs > stats["initial_allocations"] + 10
    # at the optimizer step parameters, gradients and both moments are live at once
    assert trace.peak_live_bytes() >= 4 * params
    assert trace.streams == [0]
    # a step frees all it allocates: what is live at the end is what opened the trace
    live = _live_at_end(trace.events)
    assert sum(live.values()) == sum(e[2] for e in trace.events[:stats["initial_allocations"]])
    # saved marks, per step: x (32x64 floats, for the first weight's gradient), ReLU's output
    # (saved by ReLU and by the second Linear), log_softmax's output (by it and by nll_loss); the
    # weights (parameters, or views of them) and the 256-byte targets are not marked
    marks = trace_format.validate_saved(stats["saved"], trace.events)
    sizes = trace.sizes()
    assert [sizes[i] for _, i in marks] == [32 * 64 * 4, 32 * 512 * 4, 32 * 512 * 4, 32 * 10 * 4, 32 * 10 * 4] * 2
    assert stats["saved_marks"] == 10 and stats["saved_unmatched"] == 0 and stats["marker_allocations_dropped"] == 0
    for (index, ident), prev in zip(marks, [(0, -1), *marks]):
        assert index >= prev[0]
        # each tensor is saved after its allocation (ReLU's output: once clamp_min made it)
        assert any(e == ("a", ident, sizes[ident], 0) for e in trace.events[:index + 1])


def _doc(saved: list | None = None) -> dict:
    doc = {"format": trace_format.FORMAT, "name": "t", "source": "cpu-profiler", "model": {}, "workload": {},
           "recorded": {}, "events": [["a", 0, 4096, 0], ["a", 1, 64, 0], ["f", 0], ["a", 2, 4096, 0]]}
    if saved is not None:
        doc["saved"] = saved
    return doc


def test_the_saved_field(tmp_path: Path):
    plain = trace_format.from_document(_doc())
    assert plain.saved == () and "saved" not in plain.to_document()
    marked = trace_format.from_document(_doc([[0, 0], [1, 0], [1, 1], [3, 2]]))
    assert marked.saved == ((0, 0), (1, 0), (1, 1), (3, 2))
    path = trace_format.save(marked, tmp_path / "t.json.gz")
    assert trace_format.load(path) == marked and marked.to_document()["saved"] == [[0, 0], [1, 0], [1, 1], [3, 2]]
    bad = {"saved must be a list": {"x": 1}, r"expected \[event_index, id\]": [[0]],
           "outside the 4 events": [[4, 2]], "comes after 1": [[1, 0], [0, 0]],
           "allocation 0 is not live after event 2": [[2, 0]], "allocation 2 is not live after event 1": [[1, 2]]}
    for message, saved in bad.items():
        with pytest.raises(trace_format.TraceError, match=message):
            trace_format.from_document(_doc(saved))
    with pytest.raises(trace_format.TraceError, match="not live"):
        trace_format.save(trace_format.Trace("t", "cpu-profiler", {}, {}, {}, plain.events, ((2, 0),)), tmp_path / "x")


def test_pairing_by_address():
    p = rt.Pairing()
    p.existing(0x100, 64)
    p.alloc(0x200, 32)
    p.free(0x100, 64)   # an existing block freed
    p.free(0x300, 16)   # never seen: it existed before the recording, so it opens the trace
    p.alloc(0x200, 8)   # 0x200 is still live: its free was missed
    assert p.events() == [("a", 0, 64, 0), ("a", 1, 16, 0), ("a", 2, 32, 0), ("f", 0), ("f", 1), ("f", 2),
                          ("a", 3, 8, 0)]
    assert p.stats() == {"initial_allocations": 2, "unknown_frees": 1, "missed_frees": 1}
    trace_format.validate_events(p.events())


SIDE, THIRD = 0x7F00_0000_1000, 0x7F00_0000_2000  # stream handles


def _entry(action: str, addr: int, size: int, stream: int = 0) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "frames": []}


def _snapshot() -> dict:
    blocks0 = [{"address": 0xA000, "size": MiB, "requested_size": 1_000_000, "state": "active_allocated", "frames": []},
               {"address": 0xB000, "size": 512 * 1024, "requested_size": 500_000, "state": "active_allocated"},
               {"address": 0xC000, "size": 4096, "requested_size": 4096, "state": "inactive"}]
    blocks_side = [{"address": 0xD000, "size": 2048, "requested_size": 100, "state": "active_allocated"},
                   {"address": 0xE000, "size": 2048, "requested_size": 0, "state": "active_awaiting_free"}]
    other_device = [{"address": 0xA000, "size": 512, "requested_size": 512, "state": "active_allocated"}]
    trace = [
        {"action": "segment_alloc", "addr": 0xA000, "size": 2 * MiB, "stream": 0},
        _entry("alloc", 0xB000, 500_000),
        _entry("free_requested", 0xF000, 4096, SIDE),
        _entry("free_completed", 0xF000, 4096, SIDE),      # allocated before the recording
        _entry("alloc", 0xD000, 2048, SIDE),
        _entry("free_requested", 0xD000, 2048, SIDE),
        _entry("alloc", 0x9000, 64, 0),                      # before 0xD000's free completes
        _entry("free_completed", 0xD000, 2048, SIDE),
        _entry("alloc", 0xD000, 100, THIRD),                # the address again, on a third stream
        {"action": "oom", "size": 8 * MiB, "device_free": 0, "stream": 0},
    ]
    return {"segments": [{"device": 0, "address": 0xA000, "total_size": 2 * MiB, "stream": 0, "blocks": blocks0},
                         {"device": 0, "address": 0xD000, "total_size": 2 * MiB, "stream": SIDE, "blocks": blocks_side},
                         {"device": 1, "address": 0xA000, "total_size": 2 * MiB, "stream": 0, "blocks": other_device}],
            "device_traces": [trace, [_entry("alloc", 0x1, 512)]]}


def test_cuda_snapshot_conversion():
    events, stats = rt.snapshot_to_events(_snapshot(), device=0)
    assert events == [
        ("a", 0, 4096, 1),       # freed during the recording, allocated before it
        ("a", 1, 1_000_000, 0),  # allocated before, still allocated at the end
        ("a", 2, 2048, 1),       # awaiting its free at the end: still holds its block
        ("a", 3, 500_000, 0),
        ("f", 0),
        ("a", 4, 2048, 1),
        ("a", 5, 64, 0),
        ("f", 4),                # at free_completed, not free_requested
        ("a", 6, 100, 2),
    ]
    trace_format.validate_events(events)
    assert stats["initial_allocations"] == 3 and stats["unknown_frees"] == 1 and stats["missed_frees"] == 0
    assert stats["streams"] == {"0": 0, str(SIDE): 1, str(THIRD): 2}
    assert stats["ignored_entries"] == 4  # segment_alloc, 2 free_requested, oom


def test_cuda_snapshot_of_another_device():
    events, stats = rt.snapshot_to_events(_snapshot(), device=1)
    assert events == [("a", 0, 512, 0), ("a", 1, 512, 0)]
    assert stats["initial_allocations"] == 1


def test_page_rounding_and_size_bands():
    assert [rt.page_rounded(n) for n in (1, 512, 513, MiB, MiB + 1, 3 * MiB)] == [512, 512, 1024, MiB, 2 * MiB, 4 * MiB]
    events = [("a", 0, MiB, 0), ("a", 1, MiB + 1, 0), ("f", 0), ("a", 2, 33 * MiB, 0)]
    trace = trace_format.Trace("t", "cpu-profiler", {}, {}, {}, trace_format.validate_events(events))
    f = rt.figures(trace)
    assert f["peak_live_bytes"] == 34 * MiB + 1 and f["peak_page_rounded_bytes"] == 36 * MiB
    assert (f["allocs <=1MiB"], f["allocs 1-32MiB"], f["allocs >32MiB"]) == (1, 1, 1)


def test_cli_errors(capsys, monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as e:
        rt.main(["--model", "resnet51"])
    assert e.value.code == 2 and "known: resnet50, vit" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert rt.main(["--model", "bert", "--device", "cuda"]) == 2
        assert "no CUDA device" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert rt.main(["--model", "tiny_gpt2", "--out", str(tmp_path)]) == 2
    assert "pip install transformers" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


STORED = trace_format.stored()


def test_the_traces_are_stored():
    assert {p.name.removesuffix(".json.gz") for p in STORED} >= set(trace_models.STORED)


def test_model_groups_and_names(capsys):
    tm = trace_models
    assert [m.name for m in rt._models(["all"])] == list(tm.STORED)  # what the stored traces' command records
    assert set(tm.STORED).isdisjoint(tm.EXTRA) and set(tm.STORED) | set(tm.EXTRA) == set(tm.MODELS)
    assert [m.name for m in rt._models(["bert", "extra", "bert"])] == ["bert", *tm.EXTRA]
    assert all(m.task in tm.TASKS and m.batch >= 1 and m.size >= 1 for m in rt.MODELS.values())
    for argv in (["--model", "bert", "--model", "gpt2", "--name", "x"], ["--model", "bert", "--name", "a/b"]):
        with pytest.raises(SystemExit) as e:
            rt.main(argv)
        assert e.value.code == 2 and "--name takes a plain file name, and one model" in capsys.readouterr().err


@pytest.mark.parametrize("path", STORED, ids=[p.name for p in STORED])
def test_stored_trace_loads_and_says_how_it_was_made(path: Path):
    trace = trace_format.load(path)
    assert trace.name == path.name.removesuffix(".json.gz")
    assert trace.recorded["command"].startswith("python benchmarks/record_trace.py ")
    assert trace.num_frees > 0 and trace.peak_live_bytes() >= trace.model["parameter_bytes"]
    assert trace.saved and trace.recorded["saved_marks"] == len(trace.saved)  # what autograd saved, and when
    assert trace.recorded["saved_unmatched"] == 0 and trace.recorded["marker_allocations_dropped"] == 0
    rows = [line for line in (BENCH / "traces" / "README.md").read_text().splitlines()
            if line.startswith(f"| `{path.name}` |")]
    assert len(rows) == 1, f"benchmarks/traces/README.md has no row for {path.name}"
    assert f"| {len(trace.events):,} |" in rows[0] and f"| {trace.peak_live_bytes():,} |" in rows[0]
