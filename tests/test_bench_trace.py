"""benchmarks/bench_trace.py on small synthetic traces: the replay, the capacity search, the
command line, --compare and the device-agnostic body of the GPU mode.

Owns: checks that the replay computes peak live and page-rounded peaks right, stops at the
first OOM, maps trace streams to host streams (and destroys them), that the search finds the
exact threshold (by hand: whole-page allocations cannot fragment, so min capacity == peak live),
that --capacity replays one capacity, what --trace names (a file, a folder of traces, a stored
trace), bad sizes are usage errors, --compare's exit codes, the
GPU mode's refusal without CUDA, and replay_on_device / torch_measure against a fake device.
Invariants: CPU only, small traces (the file runs in seconds); every space is closed and every
host stream destroyed (conftest checks nothing is left held); the real stored traces are not
used here (their bound test is another file's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers.benchmarks import load_script
from helpers.sizes import MiB, PAGE

bt = load_script("bench_trace")
tf = bt.trace_format


def make_trace(events: list[tuple], name: str = "synthetic") -> Any:
    return tf.Trace(name=name, source="cpu-profiler", model={"class": "test"}, workload={}, recorded={},
                    events=tf.validate_events(events))


def saved(tmp_path: Path, events: list[tuple], name: str = "synthetic") -> Path:
    return tf.save(make_trace(events, name), tmp_path / f"{name}.json.gz")


# Whole pages only (2-6 MiB, above the 1 MiB small threshold, below extents): no fragmentation.
# Live: 4, 10, 6 (free 0), 14 (+8), 8 (free 1)... peak 16 MiB at event 5.
WHOLE_PAGES = [("a", 0, 4 * MiB, 0), ("a", 1, 6 * MiB, 0), ("f", 0), ("a", 2, 2 * MiB, 0),
               ("a", 3, 6 * MiB, 0), ("a", 4, 2 * MiB, 0), ("f", 1), ("a", 5, 4 * MiB, 0), ("f", 2), ("f", 3),
               ("f", 4), ("f", 5)]
# Small and odd sizes: live peak 1000 + 3 MiB + 1 + 5000 bytes; page-rounded: 1024 + 4 MiB + 5120.
MIXED = [("a", 0, 1000, 0), ("a", 1, 3 * MiB + 1, 0), ("a", 2, 5000, 0), ("f", 1), ("a", 3, 100, 0)]


def host_config(**kw: Any) -> Any:
    from vtalloc.allocator.config import Config

    return Config(backend="host", **kw)


def test_peaks_are_computed_from_the_trace():
    t = make_trace(MIXED)
    assert t.peak_live_bytes() == 1000 + 3 * MiB + 1 + 5000
    assert bt.peak_page_rounded_bytes(t) == 1024 + 4 * MiB + 5120
    assert bt.page_rounded(MiB) == MiB and bt.page_rounded(MiB + 1) == 2 * MiB and bt.page_rounded(1) == 512
    assert make_trace(WHOLE_PAGES).peak_live_bytes() == 16 * MiB
    assert bt.bound_bytes(100 * PAGE, PAGE) == 104 * PAGE             # 4 pages beat 2%
    assert bt.bound_bytes(1000 * PAGE, PAGE) == 1020 * PAGE           # 2% beats 4 pages


def test_replay_runs_the_whole_trace_and_counts_driver_calls():
    r = bt.replay_host(bt.Compiled.of(make_trace(WHOLE_PAGES)), host_config(), 32 * MiB)
    assert r.ok and r.events_done == len(WHOLE_PAGES) and r.oom_event is None
    assert r.capacity_bytes == 32 * MiB
    assert 16 * MiB <= r.peak_mapped_bytes <= 32 * MiB
    assert r.driver_calls["total"] == sum(v for k, v in r.driver_calls.items() if k != "total")
    assert r.driver_calls["map"] > 0 and r.modeled_ns is None
    modeled = bt.replay_host(bt.Compiled.of(make_trace(WHOLE_PAGES)), host_config(cost_model="h100"), 32 * MiB)
    assert modeled.ok and modeled.modeled_ns > 0


def test_replay_stops_at_the_first_oom():
    # 14 MiB live after event 4; event 5 (2 MiB more, 16 MiB) does not fit in 14 MiB.
    r = bt.replay_host(bt.Compiled.of(make_trace(WHOLE_PAGES)), host_config(), 14 * MiB)
    assert not r.ok
    assert r.oom_event == 5 and r.oom_size == 2 * MiB and r.events_done == 5


def test_a_capacity_above_the_host_memory_limit_is_refused_before_any_space():
    with pytest.raises(bt.HostMemoryLimit):
        bt.replay_host(bt.Compiled.of(make_trace(WHOLE_PAGES)), host_config(), 64 * MiB, host_limit=32 * MiB)


def test_search_finds_the_exact_threshold():
    calls: list[int] = []

    def fits(u: int) -> bool:
        calls.append(u)
        return u >= 37

    found = bt.search_min(fits, 5, limit=1000)
    assert found.units == 37 and found.exact and found.largest_failing == 36
    assert dict(found.tries) == {u: u >= 37 for u in calls}
    assert bt.search_min(fits, 40, limit=1000).tries == ((40, True),)  # the lower end fits: one try
    assert bt.search_min(fits, 5, limit=1000, guess=38).units == 37
    with pytest.raises(bt.BenchError):
        bt.search_min(fits, 5, limit=30)
    partial = bt.search_min(fits, 5, limit=1000, deadline=0.0)  # past the deadline: no try at all
    assert partial.units is None and not partial.exact and partial.tries == ()


def test_whole_pages_need_exactly_peak_live(tmp_path):
    t = make_trace(WHOLE_PAGES)
    row = bt.measure_trace(t, tmp_path / "x", host_config(), PAGE, repeats=1, log=lambda s: None)
    assert row["peak_live_bytes"] == row["peak_page_rounded_bytes"] == 16 * MiB
    m = row["min_capacity"]
    assert m["bytes"] == 16 * MiB and m["pages"] == 8 and m["overhead_pct"] == 0.0 and m["meets_bound"]
    assert m["tries"] == [{"capacity_bytes": 16 * MiB, "ok": True}]  # the lower end is the answer
    at4 = row["at_4x"]
    assert at4["capacity_bytes"] == 64 * MiB and at4["ok"] and at4["events"] == len(WHOLE_PAGES)
    assert at4["peak_mapped_ratio"] == at4["peak_mapped_bytes"] / (16 * MiB)
    assert at4["modeled_h100_ns_per_op"] > 0 and at4["cpu_ns_per_op"] > 0
    assert row["at_min"]["capacity_bytes"] == 16 * MiB and "cpu_ns_per_op" not in row["at_min"]


def test_search_on_a_trace_whose_answer_is_above_the_lower_end(tmp_path):
    # Two 1 MiB-and-a-bit blocks take a page each: peak live is ~2 MiB + 2 bytes, so the lower end
    # (2 pages) fits; 3 MiB + 1 alone also needs 2 pages. 5 MiB + 1 needs 3 pages: min 6 MiB.
    t = make_trace([("a", 0, MiB + 1, 0), ("a", 1, MiB + 1, 0), ("f", 0), ("f", 1), ("a", 2, 5 * MiB + 1, 0)])
    row = bt.measure_trace(t, tmp_path / "x", host_config(), PAGE, repeats=1, log=lambda s: None)
    assert row["min_capacity"]["bytes"] == 6 * MiB


class SpyLib:
    """The native library with vta_malloc and the test streams' calls recorded."""

    def __init__(self, lib: Any) -> None:
        self._lib, self.mallocs, self.created, self.destroyed = lib, [], [], []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def vta_malloc(self, h: Any, n: int, s: int, out: Any) -> int:
        self.mallocs.append((n, s))
        return self._lib.vta_malloc(h, n, s, out)

    def vta_debug_stream_create(self, h: Any, out: Any) -> int:
        status = self._lib.vta_debug_stream_create(h, out)
        self.created.append(out._obj.value)
        return status

    def vta_debug_stream_destroy(self, h: Any, s: int) -> int:
        self.destroyed.append(s)
        return self._lib.vta_debug_stream_destroy(h, s)


def test_trace_streams_map_to_host_streams_and_are_destroyed(monkeypatch):
    from vtalloc.allocator import _native

    spy = SpyLib(_native.load())
    monkeypatch.setattr(_native, "load", lambda: spy)
    # stream 0 is the default stream; 3 and 7 are one host stream each; 7's allocation is never freed
    events = [("a", 0, 4096, 0), ("a", 1, 8192, 3), ("a", 2, 3 * MiB, 7), ("f", 1), ("a", 3, 12288, 3), ("f", 0)]
    r = bt.replay_host(bt.Compiled.of(make_trace(events)), host_config(), 16 * MiB)
    assert r.ok
    assert len(spy.created) == 2 and sorted(spy.destroyed) == sorted(spy.created)
    by_size = dict(spy.mallocs)
    assert by_size[4096] == 0
    assert by_size[8192] == by_size[12288] != 0 and by_size[8192] in spy.created
    assert by_size[3 * MiB] in spy.created and by_size[3 * MiB] != by_size[8192]


def run_main(*argv: str) -> int:
    try:
        return bt.main(list(argv))
    except SystemExit as e:
        return int(e.code)


def test_capacity_replays_one_capacity_and_writes_the_record(tmp_path, capsys):
    path = saved(tmp_path, WHOLE_PAGES)
    out = tmp_path / "r.json"
    assert run_main("--trace", str(path), "--capacity", "20MiB", "--quick", "--out", str(out), "--label", "after",
                    "--note", "test") == 0
    record = json.loads(out.read_text())
    assert record["label"] == "after" and record["notes"] == ["test"] and record["config"]["backend"] == "host"
    assert record["provenance"]["git"]["commit"] and "--capacity" in record["provenance"]["command"]
    assert Path(record["provenance"]["package"]["path"]).name == "allocator"
    row = record["traces"][0]
    assert "min_capacity" not in row and "at_4x" not in row
    at = row["at_capacity"]
    assert at["capacity_bytes"] == 20 * MiB and at["ok"] and at["events"] == len(WHOLE_PAGES)
    printed = capsys.readouterr().out
    assert "| synthetic | 16 MiB | 16 MiB | — (not searched) |" in printed


def test_a_trace_argument_names_a_file_a_folder_or_a_stored_trace(tmp_path, capsys):
    """trace_format.resolve, what bench_trace.py, sim_torch_allocator.py and bench_saved_offload.py
    take for --trace: a folder stands for every trace in it, by name (regenerate_cpu.py passes the
    held-out traces' folder)."""
    folder = tmp_path / "held-out"
    b, a = saved(folder, WHOLE_PAGES, "b"), saved(folder, MIXED, "a")
    assert tf.resolve(str(folder)) == [a, b] and tf.resolve(str(b)) == [b]
    assert tf.resolve("tiny_gpt2") == [tf.TRACES_DIR / "tiny_gpt2.json.gz"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(tf.TraceNotFound, match="no \\*.json.gz trace in"):
        tf.resolve(str(tmp_path / "empty"))
    with pytest.raises(tf.TraceNotFound, match="stored: .*tiny_gpt2"):
        tf.resolve("no-such-trace")
    out = tmp_path / "r.json"
    assert run_main("--trace", str(folder), "--capacity", "20MiB", "--quick", "--out", str(out)) == 0
    assert [r["name"] for r in json.loads(out.read_text())["traces"]] == ["a", "b"]


def test_the_record_names_the_library_it_was_told_to_load(monkeypatch):
    monkeypatch.setenv("VTALLOC_LIBRARY", bt.__file__)
    info = bt._library()
    assert info["path"] == bt.__file__ and len(info["sha256"]) == 64 and info["git"]["commit"]
    monkeypatch.delenv("VTALLOC_LIBRARY")
    assert bt._library() is None


@pytest.mark.parametrize("argv", [
    ["--page-size", "2mb"], ["--page-size", "lots"], ["--small-threshold", "0"], ["--capacity", "-1"],
    ["--config", "capacity=1GiB"], ["--config", "no_such_field=1"], ["--config", "page_size"],
    ["--config", "host_granularity=3x"], ["--trace", "no-such-trace"], ["--host-memory-limit", "1mb"],
])
def test_bad_arguments_are_usage_errors(argv, tmp_path, capsys):
    path = saved(tmp_path, WHOLE_PAGES)
    args = argv if argv[0] == "--trace" else ["--trace", str(path), *argv]
    assert run_main(*args, "--out", str(tmp_path / "never.json")) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "never.json").exists()


def test_a_config_the_core_refuses_is_a_usage_error(tmp_path, capsys):
    path = saved(tmp_path, WHOLE_PAGES)
    assert run_main("--trace", str(path), "--page-size", "3MiB", "--out", str(tmp_path / "n.json")) == 2
    assert "Config is refused" in capsys.readouterr().err


def result(name: str, *, pct: float, mapped: float, calls: float, ns: float, live: int = 100 * PAGE,
           bound_over: int = 4 * PAGE) -> dict[str, Any]:
    """One trace's row of a result file, with just what --compare reads."""
    return {"name": name, "peak_live_bytes": live, "bound_bytes": live + bound_over,
            "min_capacity": {"bytes": int(live * (1 + pct / 100)), "overhead_pct": pct},
            "at_4x": {"ok": True, "peak_mapped_bytes": int(live * mapped), "peak_mapped_ratio": mapped,
                      "driver_calls_per_op": calls, "modeled_h100_ns_per_op": ns}}


def write(tmp_path: Path, name: str, rows: list[dict[str, Any]], label: str) -> str:
    p = tmp_path / name
    p.write_text(json.dumps({"label": label, "traces": rows}))
    return str(p)


def test_compare_passes_when_after_meets_every_bound(tmp_path, capsys):
    before = write(tmp_path, "b.json", [result("m", pct=11.0, mapped=2.0, calls=0.3, ns=4000)], "before")
    after = write(tmp_path, "a.json", [result("m", pct=1.0, mapped=1.1, calls=0.32, ns=4300)], "after")
    assert run_main("--compare", before, after) == 0
    printed = capsys.readouterr().out
    assert "| m | 11.00% → 1.00% | 2.000 → 1.100 |" in printed and "(x1.067)" in printed and "| ok |" in printed


@pytest.mark.parametrize("after_row,why", [
    (result("m", pct=5.0, mapped=1.1, calls=0.3, ns=4000), "bound"),            # 5 pages over > 4 pages
    (result("m", pct=1.0, mapped=1.3, calls=0.3, ns=4000), "peak mapped"),
    (result("m", pct=1.0, mapped=1.1, calls=0.34, ns=4000), "driver calls/op"),  # 0.34 / 0.3 > 1.1
    (result("m", pct=1.0, mapped=1.1, calls=0.3, ns=4500), "modeled time/op"),
    ({"name": "m", "peak_live_bytes": 1, "bound_bytes": 2, "min_capacity": {"error": "no capacity"},
      "at_4x": {"capacity_bytes": 4, "skipped": "above the limit"}}, "lacks figures"),
])
def test_compare_fails_when_after_misses_a_bound(tmp_path, capsys, after_row, why):
    before = write(tmp_path, "b.json", [result("m", pct=11.0, mapped=2.0, calls=0.3, ns=4000)], "before")
    after = write(tmp_path, "a.json", [after_row], "after")
    assert run_main("--compare", before, after) == 1
    assert why in capsys.readouterr().out


def test_compare_fails_when_a_trace_is_missing_from_after(tmp_path, capsys):
    rows = [result("m", pct=1.0, mapped=1.1, calls=0.3, ns=4000), result("n", pct=1.0, mapped=1.1, calls=0.3, ns=1)]
    before = write(tmp_path, "b.json", rows, "before")
    after = write(tmp_path, "a.json", rows[:1], "after")
    assert run_main("--compare", before, after) == 1
    assert "n: in BEFORE but not in AFTER" in capsys.readouterr().out
    assert run_main("--compare", before, str(tmp_path / "missing.json")) == 2


def test_gpu_mode_refuses_without_cuda(tmp_path, capsys, monkeypatch):
    path = saved(tmp_path, WHOLE_PAGES)
    reason = bt.cuda_unavailable_reason()
    if reason is None:  # a CUDA machine: the refusal itself is still checked, with a made-up reason
        monkeypatch.setattr(bt, "cuda_unavailable_reason", lambda: "made up for the test")
    assert run_main("--torch", "--trace", str(path), "--out", str(tmp_path / "n.json")) == 2
    err = capsys.readouterr().err
    assert err.startswith("needs a CUDA device: ") and (reason or "made up") in err
    assert not (tmp_path / "n.json").exists()


class FakeOOM(Exception):
    pass


class FakeDevice:
    """A device of ``capacity`` bytes that rounds like nothing: a handle is (id, size, stream)."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity, self.live, self.peak, self.next = capacity, 0, 0, 0
        self.allocs: list[tuple[int, str]] = []
        self.freed: list[int] = []
        self.syncs = 0

    def stream(self, number: int) -> str:
        return f"stream{number}"

    def alloc(self, size: int, stream: str) -> tuple[int, int, str]:
        if size == 13:
            raise RuntimeError("not an OOM")
        if self.capacity is not None and self.live + size > self.capacity:
            raise FakeOOM(f"out of memory: {size} more than {self.capacity - self.live} left\nsecond line")
        self.live += size
        self.peak = max(self.peak, self.live)
        self.allocs.append((size, stream))
        self.next += 1
        return (self.next - 1, size, stream)

    def free(self, handle: tuple[int, int, str]) -> None:
        self.live -= handle[1]
        self.freed.append(handle[0])

    def is_oom(self, error: BaseException) -> bool:
        return isinstance(error, FakeOOM)

    def synchronize(self) -> None:
        self.syncs += 1

    def peaks(self) -> dict[str, Any]:
        return {"peak_reserved_bytes": self.peak, "peak_allocated_bytes": self.peak, "live_at_end": self.live}


STREAMED = [("a", 0, 100, 0), ("a", 1, 200, 2), ("f", 0), ("a", 2, 300, 5), ("f", 1), ("a", 3, 50, 2)]


def test_the_gpu_body_replays_on_any_device():
    dev = FakeDevice()
    r = bt.replay_on_device(make_trace(STREAMED).events, dev)
    assert r["ok"] and r["events_done"] == len(STREAMED) and r["oom"] is None
    assert r["peak_reserved_bytes"] == 500 and r["live_at_end"] == 350  # peaks read before the clean-up
    assert dev.allocs == [(100, "stream0"), (200, "stream2"), (300, "stream5"), (50, "stream2")]
    assert dev.freed[:2] == [0, 1] and sorted(dev.freed) == [0, 1, 2, 3] and dev.live == 0  # trace order, then the rest


def test_the_gpu_body_stops_at_the_first_oom_and_frees_the_rest():
    dev = FakeDevice(capacity=450)
    r = bt.replay_on_device(make_trace(STREAMED).events, dev)
    assert not r["ok"] and r["events_done"] == 3
    assert r["oom"] == {"event": 3, "size": 300, "error": "out of memory: 300 more than 250 left"}
    assert dev.live == 0 and [a[0] for a in dev.allocs] == [100, 200]


def test_the_gpu_body_lets_other_errors_through():
    with pytest.raises(RuntimeError, match="not an OOM"):
        bt.replay_on_device(make_trace([("a", 0, 13, 0)]).events, FakeDevice())


def test_torch_measure_searches_with_one_fresh_device_per_try(tmp_path):
    path = saved(tmp_path, WHOLE_PAGES)
    runs: list[int | None] = []

    def fake_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
        """What torch_child does, on a fake device with torch's 2 MiB rounding plus 6 MiB of overhead."""
        runs.append(cfg["capacity"])
        dev = FakeDevice(None if cfg["capacity"] is None else cfg["capacity"] - 6 * MiB)
        r = bt.replay_on_device(tf.load(cfg["trace"]).events, dev)
        return {"status": "ok", "total_memory_bytes": 80 << 30, **r,
                "peak_reserved_bytes": r["peak_reserved_bytes"] + 6 * MiB}

    row = bt.torch_measure(path, "native", 16 * MiB, 2 * MiB, {}, deadline=None, timeout=1, run=fake_child)
    assert runs[0] is None and row["uncapped"]["peak_reserved_bytes"] == 22 * MiB
    m = row["min_capacity"]
    assert m["bytes"] == 22 * MiB and m["exact"] and m["largest_failing_bytes"] == 20 * MiB
    assert m["overhead_pct"] == pytest.approx(6 / 16 * 100)
    assert [t["capacity_bytes"] for t in m["tries"]] == runs[1:]  # one child per try
    assert runs[1:3] == [16 * MiB, 22 * MiB]  # the lower end, then the uncapped peak as the first guess


def test_torch_measure_records_a_child_that_fails(tmp_path):
    path = saved(tmp_path, WHOLE_PAGES)

    def broken(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
        if cfg["capacity"] is None:
            return {"status": "ok", "ok": True, "total_memory_bytes": 1 << 30, "peak_reserved_bytes": 20 * MiB}
        return {"status": "error", "error": "Segmentation fault"}

    row = bt.torch_measure(path, "vtalloc", 16 * MiB, 2 * MiB, {}, deadline=None, timeout=1, run=broken)
    assert "Segmentation fault" in row["min_capacity"]["error"]


def test_gpu_mode_measures_peaks_first_then_searches(tmp_path, capsys, monkeypatch):
    """The whole --torch flow with the per-process runner replaced by the fake device: every
    allocator's uncapped run first, then the searches; the record and its table."""
    paths = [saved(tmp_path, WHOLE_PAGES, "one"), saved(tmp_path, STREAMED, "two")]
    calls: list[tuple[str, str, int | None]] = []

    def fake_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
        calls.append((Path(cfg["trace"]).name, cfg["allocator"], cfg["capacity"]))
        dev = FakeDevice(cfg["capacity"])
        return {"status": "ok", "total_memory_bytes": 1 << 30, **bt.replay_on_device(tf.load(cfg["trace"]).events, dev)}

    monkeypatch.setattr(bt, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(bt, "run_torch_child", fake_child)
    out = tmp_path / "gpu.json"
    assert run_main("--torch", "--trace", str(paths[0]), "--trace", str(paths[1]), "--allocators", "native,vtalloc",
                    "--resolution", "2MiB", "--out", str(out)) == 0
    assert [c[2] for c in calls[:4]] == [None] * 4 and all(c[2] is not None for c in calls[4:])
    record = json.loads(out.read_text())
    one = record["traces"][0]
    assert [r["allocator"] for r in one["allocators"]] == ["native", "vtalloc"]
    assert all(r["min_capacity"]["bytes"] == 16 * MiB and r["min_capacity"]["exact"] for r in one["allocators"])
    assert record["traces"][1]["allocators"][0]["min_capacity"]["bytes"] == 2 * MiB  # 500 B live: the resolution
    assert "| one | native | 16 MiB | 16 MiB (1.000) |" in capsys.readouterr().out
