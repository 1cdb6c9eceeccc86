"""A host space's recorded history in PyTorch's snapshot format (AddressSpace.record_history),
and the readable summaries (space.summary(), print(space.stats())).

The trace entries are checked as memory_viz reads them (tests/helpers/memory_viz.py walks the
timeline and the allocator-state view the way MemoryViz.js does), and through
torch.cuda._memory_viz's own trace text and trace_plot HTML. The GPU half (torch's
_record_memory_history under enable()) is tests/test_torch_binding_gpu.py's.
"""

from __future__ import annotations

import pickle

import pytest
from helpers import memory_viz

from vtalloc.allocator import AddressSpace, InvalidArgumentError, OutOfMemoryError

MiB = 1 << 20


def make_two(space: AddressSpace) -> tuple[int, int]:
    return space.malloc(3 * MiB), space.malloc(100_000)


def test_recorded_allocations_and_frees_carry_their_stacks_in_torchs_format():
    with AddressSpace(backend="host", capacity="16MiB", page_size="2MiB") as space:
        before = space.malloc(4096)                       # allocated before recording: no stack
        space.record_history(max_entries=1000)
        a, b = make_two(space)
        space.free(a)
        space.free(before)
        snap = space.memory_snapshot()
        space.free(b)
    trace = snap["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc", "alloc", "free_requested", "free_completed",
                                            "free_requested", "free_completed"]
    assert [(e["addr"], e["size"]) for e in trace[:3]] == [(a, 3 * MiB), (b, 100_000), (a, 3 * MiB)]
    assert trace[4]["addr"] == before and trace[4]["size"] == 0   # a free of a block recorded before
    for e in trace:
        assert {"action", "addr", "size", "stream", "time_us", "frames"} <= set(e)
        assert e["time_us"] > 1_600_000_000 * 10**6              # microseconds since the epoch, as torch's
    top = trace[0]["frames"][0]
    assert top["name"] == "make_two" and top["filename"] == __file__ and isinstance(top["line"], int)
    assert trace[2]["frames"][0]["name"] == "test_recorded_allocations_and_frees_carry_their_stacks_in_torchs_format"
    assert not any("address_space.py" in f["filename"] for e in trace for f in e["frames"])  # vtalloc's own frames out
    live = [blk for seg in snap["segments"] for blk in seg["blocks"] if blk["state"] == "active_allocated"]
    assert [blk["frames"][0]["name"] for blk in live] == ["make_two"]   # where the live block was made
    timeline = memory_viz.check(snap)
    assert timeline.elements == 3 and timeline.events == 4 and timeline.max_bytes >= 3 * MiB + 100_000


def test_memory_viz_and_torchs_tools_read_the_recorded_snapshot(tmp_path):
    from torch.cuda import _memory_viz

    with AddressSpace(backend="host", capacity="16MiB", page_size="2MiB") as space:
        space.record_history()
        keep = [space.malloc(n) for n in (1 * MiB, 256 * 1024, 5 * MiB)]
        space.free(keep.pop(1))
        t = space.tensor((1024,))
        del t
        path = tmp_path / "snapshot.pickle"
        path.write_bytes(pickle.dumps(space.memory_snapshot()))   # what _dump_snapshot writes
        for x in keep:
            space.free(x)
    snap = pickle.loads(path.read_bytes())
    memory_viz.check(snap)
    text = _memory_viz.trace(snap)
    assert "Device 0" in text and "del " in text and "free completed" in text
    html = _memory_viz.trace_plot(snap)
    assert "Active Memory Timeline" in html and "snapshot.pickle" in html
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("alloc") == 4 and actions.count("free_completed") == 2   # the tensor's storage too


def test_an_out_of_memory_is_recorded_with_what_was_asked():
    with AddressSpace(backend="host", capacity="4MiB", page_size="2MiB") as space:
        space.record_history()
        a = space.malloc(3 * MiB)
        with pytest.raises(OutOfMemoryError):
            space.malloc(3 * MiB)
        snap = space.memory_snapshot()
        space.free(a)
    oom = snap["device_traces"][0][-1]
    assert oom["action"] == "oom" and oom["size"] == 3 * MiB and "addr" not in oom
    assert oom["device_free"] == 0   # capacity 4 MiB, 4 MiB mapped under the first allocation's pages
    assert "raise OutOfMemoryError" in __import__("torch").cuda._memory_viz.trace(snap)
    memory_viz.check(snap)


def test_history_is_bounded_can_go_without_stacks_and_stops():
    with AddressSpace(backend="host", capacity="16MiB") as space:
        space.record_history(max_entries=5, stacks=False)
        for _ in range(4):
            space.free(space.malloc(4096))
        trace = space.memory_snapshot()["device_traces"][0]
        assert [e["action"] for e in trace] == ["free_requested", "free_completed", "alloc", "free_requested",
                                                "free_completed"]   # 12 recorded, the oldest 7 dropped
        assert all(e["frames"] == [] for e in trace)
        space.record_history(False)
        space.free(space.malloc(4096))
        assert space.memory_snapshot()["device_traces"][0] == []
        for bad in (0, -1, 1.5, True):
            with pytest.raises(InvalidArgumentError):
                space.record_history(max_entries=bad)


def test_the_checker_sees_what_would_break_memory_viz():
    """The checker is not vacuous: a freed block outside every segment breaks the state view,
    a frame without a name breaks the stack display."""
    outside = {"segments": [], "device_traces": [[
        {"action": "free_requested", "addr": 1 << 30, "size": 4096, "stream": 0, "frames": []},
        {"action": "free_completed", "addr": 1 << 30, "size": 4096, "stream": 0, "frames": []}]]}
    with pytest.raises(AssertionError, match="lies in no segment"):
        memory_viz.check(outside)
    nameless = {"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 0, "size": 1, "stream": 0, "frames": [{"filename": "x.py", "line": 1}]}]]}
    with pytest.raises(AssertionError, match="frame"):
        memory_viz.check(nameless)


def test_print_stats_is_a_few_readable_lines_and_summary_a_table():
    """print(space.stats()) was one line of 1,445 characters."""
    with AddressSpace(backend="host", capacity="64MiB") as space:
        blocks = [space.malloc(2 * MiB) for _ in range(8)]
        space.free(blocks[0])
        stats = space.stats()
        text = str(stats)
        table = space.summary()
        for x in blocks[1:]:
            space.free(x)
    lines = text.splitlines()
    assert 4 <= len(lines) <= 12 and max(map(len, lines)) <= 100, text
    assert lines[0].startswith("Stats: capacity 64 MiB") and "allocated 14 MiB (peak 16 MiB)" in text
    assert "7 live, 8 allocations, 1 frees" in text
    assert repr(stats).startswith("Stats(capacity_bytes=")   # repr keeps every field
    rows = table.splitlines()
    assert max(map(len, rows)) <= 80 and len(rows) > 20
    assert any(r.startswith("| allocated (as requested)") and "14 MiB" in r and "16 MiB" in r for r in rows)
    assert any("live allocations" in r and "| " in r and r.rstrip("| ").endswith("7") for r in rows)
