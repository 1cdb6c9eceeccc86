"""Each CPU benchmark checks that it measured the path it names, and fails loudly if not (issue 26).

Owns: quick runs of benchmarks/bench_malloc_free.py, bench_evict.py, bench_saved_offload.py and
bench_trace.py (host), each in a subprocess, asserting exit 0 and the JSON's ``path_checked``
present and passed; and, with counters of another path, that each script's checking function
fails and names the row (bench_malloc_free.py's main too: exit 1 after writing the JSON). The
quick runs of bench_churn.py, bench_offload_training.py and probe_paged_footprint.py are in
tests/test_benchmark_smoke.py, which asserts their ``path_checked`` too; benchmarks/lib/path_check.py's
own rules are here.
Invariants: nothing here judges speed; every check is shown failing on another path's counters
(the remap case of issue 26 among them: 1.05 reclaims per op where the name promised none).
"""

from __future__ import annotations

import json

import pytest

from helpers.benchmarks import load_script
from helpers.sizes import MiB
from test_benchmark_smoke import run_bench


def passed(record: dict, rows: int | None = None) -> dict:
    pc = record["path_checked"]
    assert pc["passed"] is True and pc["failures"] == [], pc["failures"]
    assert all(c["passed"] and c["mismatches"] == [] for c in pc["checks"])
    assert pc["rows_checked"] == len(pc["checks"]) > 0
    if rows is not None:
        assert pc["rows_checked"] == rows
    return pc


# -- lib/path_check.py ------------------------------------------------------------------------------

def test_path_check_is_exact_unless_a_bound_is_written():
    pc = load_script("lib.path_check")
    assert pc.check("r", "p", {"calls": 4}, {"calls": 4})["passed"]
    c = pc.check("r", "p", {"calls": 4, "mode": "copy"}, {"calls": 5, "mode": "mapped"})
    assert not c["passed"] and c["mismatches"] == ["calls=5 (expected 4)", "mode='mapped' (expected 'copy')"]
    assert pc.check("r", "p", {"n": {"min": 1}}, {"n": 3})["passed"]
    assert not pc.check("r", "p", {"n": {"min": 1}}, {"n": 0})["passed"]
    assert not pc.check("r", "p", {"n": {"max": 1}}, {"n": 2})["passed"]
    assert not pc.check("r", "p", {"n": {"min": 1}}, {})["passed"]  # a counter missing is a miss
    assert pc.check("r", "p", {"m": {"one_of": ["copy", "mapped"]}}, {"m": "copy"})["passed"]
    assert not pc.check("r", "p", {"m": {"one_of": ["copy", "mapped"]}}, {"m": "auto"})["passed"]
    s = pc.summary([c])
    assert s["passed"] is False and s["failures"] == ["r: not the p path: calls=5 (expected 4), mode='mapped' "
                                                      "(expected 'copy')"]
    with pytest.raises(pc.PathNotTaken, match="bench_x: 1 row"):
        pc.require([c], "bench_x")
    pc.require([pc.check("r", "p", {}, {})], "bench_x")  # nothing failed: no error


# -- bench_malloc_free.py ---------------------------------------------------------------------------

def test_malloc_free_quick_checks_every_row_exactly(tmp_path):
    out = tmp_path / "mf.json"
    run_bench("bench_malloc_free.py", "--backend", "host", "--quick", "--no-native", "--out", str(out))
    record = json.loads(out.read_text())
    passed(record, rows=len(record["results"]))
    handles = {2 * MiB: 1, 8 * MiB: 4, 64 * MiB: 1}  # 64 MiB is one extent (docs/eviction.md)
    for r in record["results"]:
        want = r["path_check"]["expected"]
        if r["path"] == "reuse":
            assert want == {"map_calls": 0, "unmap_calls": 0, "page_reclaims": 0} and r["cached_path_only"]
        else:
            calls = r["timed_ops"] * handles[r["size_bytes"]]
            assert want == {"map_calls": calls, "unmap_calls": calls, "page_reclaims": 0} and r["map_path_taken"]
            assert r["map_calls"] == calls  # exact: not "at least one per op"


def test_malloc_free_check_fails_on_another_paths_counters():
    mf = load_script("bench_malloc_free")
    ops = 1000
    row = {"path": "map", "layer": "python_api", "size_bytes": 8 * MiB, "threads": 1, "timed_ops": ops,
           "page_bytes": 2 * MiB, "map_calls": ops, "unmap_calls": ops, "page_reclaims": 0}
    c = mf.path_check(row, None)  # one map per op: the old ">= 1 per op" check passed this
    assert not c["passed"] and c["row"] == "python_api map 8 MiB x1"
    assert c["mismatches"] == [f"map_calls={ops} (expected {4 * ops})", f"unmap_calls={ops} (expected {4 * ops})"]
    # the remap case of issue 26: 1.05 reclaims per op on a row whose path has none
    c = mf.path_check({**row, "map_calls": 4 * ops, "unmap_calls": 4 * ops, "page_reclaims": 1050}, None)
    assert c["mismatches"] == ["page_reclaims=1050 (expected 0)"]
    reuse = {**row, "path": "reuse", "threads": 2, "map_calls": 3, "unmap_calls": 0}
    assert mf.path_check(reuse, None)["mismatches"] == ["map_calls=3 (expected 0)"]
    assert mf.checked(dict(reuse), None)["cached_path_only"] is False


def test_malloc_free_exits_1_naming_the_row_after_writing_the_json(tmp_path, monkeypatch, capsys):
    mf = load_script("bench_malloc_free")
    monkeypatch.setattr(mf, "SMALL_SIZES", [])
    monkeypatch.setattr(mf, "LARGE_SIZES", [2 * MiB])
    monkeypatch.setattr(mf, "THREADS", [1])
    monkeypatch.setattr(mf, "bench_references", lambda *a: [])
    monkeypatch.setattr(mf, "map_handles", lambda *a: 2)  # as if each malloc should have mapped two handles
    out = tmp_path / "mf.json"
    assert mf.main(["--backend", "host", "--quick", "--no-native", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "PATH CHECK FAILED" in err and "python_api map 2 MiB x1: not the map path: map_calls=" in err
    record = json.loads(out.read_text())
    assert record["path_checked"]["passed"] is False and record["problems"] == record["path_checked"]["failures"]
    assert [r["path"] for r in record["results"] if not r["path_check"]["passed"]] == ["map"]


# -- bench_evict.py ---------------------------------------------------------------------------------

def test_evict_quick_checks_each_mode_and_the_paged_training(tmp_path):
    out = tmp_path / "evict.json"
    run_bench("bench_evict.py", "--quick", "--out", str(out))
    record = json.loads(out.read_text())
    pc = passed(record, rows=4)  # mapped, copy, auto, the paged training
    by_row = {c["row"]: c for c in pc["checks"]}
    assert by_row["bandwidth mapped 32 MiB"]["measured"]["active_mode"] == "mapped"
    assert by_row["bandwidth copy 32 MiB"]["measured"]["active_mode"] == "copy"
    for mode in ("mapped", "copy", "auto"):
        m = by_row[f"bandwidth {mode} 32 MiB"]["measured"]
        assert m["bytes_evicted_total"] == m["bytes_restored_total"] == 3 * 32 * MiB and m["evictions"] == 3 * 16
    assert by_row["training paged_activations"]["measured"]["offloads"] > 0


def test_evict_checks_fail_on_another_mode_or_nothing_moved():
    ev = load_script("bench_evict")
    before = {k: 0 for k in ("bytes_evicted_total", "bytes_restored_total", "evictions", "restores",
                             "pressure_evictions")}
    moved = {"bytes_evicted_total": 64 * MiB, "bytes_restored_total": 64 * MiB, "evictions": 32, "restores": 32,
             "pressure_evictions": 0}
    assert ev.bandwidth_check("b", "mapped", 32 * MiB, 2, 2 * MiB, "mapped", before, moved)["passed"]
    c = ev.bandwidth_check("bandwidth mapped 32 MiB", "mapped", 32 * MiB, 2, 2 * MiB, "copy", before, moved)
    assert not c["passed"] and c["mismatches"] == ["active_mode='copy' (expected 'mapped')"]
    c = ev.bandwidth_check("b", "copy", 32 * MiB, 2, 2 * MiB, "copy", before, before)  # nothing moved
    assert not c["passed"] and len(c["mismatches"]) == 4
    c = ev.bandwidth_check("b", "auto", 32 * MiB, 2, 2 * MiB, "auto", before, {**moved, "pressure_evictions": 5})
    assert c["mismatches"] == ["active_mode='auto' (expected {'one_of': ['copy', 'mapped']})",
                               "pressure_evictions=5 (expected 0)"]
    t = ev.training_check({"offloads": 0, "evictions": 0, "restores": 0})
    assert not t["passed"] and t["row"] == "training paged_activations"


# -- bench_churn.py, bench_saved_offload.py, bench_trace.py ------------------------------------------

def test_churn_enables_vtalloc_before_anything_initializes_torchs_cuda_allocator(monkeypatch):
    """On the H200 (2026-11-28) the vtalloc run of bench_churn.py --backend cuda never ran: it read
    torch.cuda.get_device_properties() (which initializes torch's CUDA allocator) before enable(),
    which is then refused. With a fake torch that records the order, enable() comes first and a
    cap in % is resolved from the driver's figure."""
    import types

    import vtalloc.allocator.device_info as device_info
    import vtalloc.allocator.torch as vt

    churn = load_script("bench_churn")
    order: list[str] = []
    props = types.SimpleNamespace(total_memory=80 << 30, name="fake")
    cuda = types.SimpleNamespace(get_device_properties=lambda i: order.append("torch initialized") or props,
                                 set_per_process_memory_fraction=lambda f, d: order.append(f"fraction {f:.2f}"))
    fake_torch = types.SimpleNamespace(cuda=cuda)

    def enable(**options):
        if "torch initialized" in order:
            raise RuntimeError("PyTorch's CUDA allocator is already initialized")
        order.append(f"enable {options['capacity']}")

    monkeypatch.setattr(vt, "enable", enable)
    monkeypatch.setattr(device_info, "device_info",
                        lambda device=0: types.SimpleNamespace(total_bytes=40 << 30))
    cap, got = churn.start_allocator("vtalloc", "50%", {}, fake_torch)
    assert got is vt and cap == 20 << 30 and order == [f"enable {20 << 30}"]
    order.clear()
    cap, got = churn.start_allocator("native", "25%", {}, fake_torch)
    assert got is None and cap == 20 << 30 and order == ["torch initialized", "fraction 0.25"]


def test_churn_host_check_fails_when_the_cap_was_never_reached():
    churn = load_script("bench_churn")
    res = {"allocs": 10, "stats_delta": {"num_allocs": 10, "num_frees": 10, "num_page_reclaims": 3}}
    assert churn.host_check(res)["passed"]
    c = churn.host_check({**res, "stats_delta": {"num_allocs": 10, "num_frees": 10}})
    assert c["mismatches"] == ["num_page_reclaims=0 (expected {'min': 1})"]
    c = churn.host_check({**res, "stats_delta": {**res["stats_delta"], "num_allocs": 12}})
    assert c["mismatches"] == ["num_allocs=12 (expected 10)"]


def test_saved_offload_quick_checks_each_row_and_fails_on_restores(tmp_path):
    out = tmp_path / "so.json"
    run_bench("bench_saved_offload.py", "--trace", "tiny_gpt2", "--budget-share", "0.25", "--out", str(out))
    record = json.loads(out.read_text())
    (c,) = passed(record, rows=1)["checks"]
    assert c["measured"]["evict_mode"] == "copy" and c["measured"]["bytes_evicted_total"] >= record["rows"][0][
        "moved_bytes"] > 0
    so = load_script("bench_saved_offload")
    stats = {"bytes_evicted_total": 10, "restores": 1, "pressure_evictions": 2, "num_ooms": 0}
    bad = so.replay_check("t budget 0.25", "mapped", stats, 20)
    assert bad["mismatches"] == ["evict_mode='mapped' (expected 'copy')", "bytes_evicted_total=10 (expected {'min': 20})",
                                 "restores=1 (expected 0)", "pressure_evictions=2 (expected 0)"]


def test_trace_quick_checks_every_replay_and_fails_on_evictions(tmp_path):
    out = tmp_path / "trace.json"
    run_bench("bench_trace.py", "--trace", "tiny_gpt2", "--quick", "--out", str(out))
    record = json.loads(out.read_text())
    pc = passed(record, rows=4)  # at 4x: the plain replay and the modeled one; at min: the same
    assert sum(c["measured"]["modeled"] for c in pc["checks"]) == 2
    (row,) = record["traces"]
    assert all(c["measured"]["num_allocs"] == c["expected"]["num_allocs"] > 0 for c in pc["checks"])
    assert row["at_4x"]["path_checked"]["passed"]
    bt = load_script("bench_trace")
    rep = bt.Replay(capacity_bytes=1, ok=True, events_done=3, oom_event=None, oom_size=None, wall_ns=1, user_ns=0,
                    sys_ns=0, peak_mapped_bytes=0, driver_calls={}, setup_driver_calls=0, modeled_ns=None,
                    counted={"num_allocs": 2, "num_frees": 1, "evictions": 1, "restores": 0, "pressure_evictions": 1},
                    done={"mallocs": 2, "frees": 1})
    c = bt.replay_check("r", rep, True)
    assert c["mismatches"] == ["evictions=1 (expected 0)", "pressure_evictions=1 (expected 0)",
                               "modeled=False (expected True)"]



def test_free_evictable_quick_checks_the_lru_work_does_not_grow_with_the_size(tmp_path):
    out = tmp_path / "free.json"
    run_bench("bench_free_evictable.py", "--quick", "--out", str(out))
    rec = json.loads(out.read_text())
    assert rec["path_checked"]["passed"]
    ev = {r["size_bytes"]: r["lru_entries_touched_per_free"] for r in rec["rows"] if r["evictable"]}
    assert ev[2 * MiB] <= ev[64 * MiB] <= 3  # the page walk touched one entry per page (32 at 64 MiB)
    bench = load_script("bench_free_evictable")
    walked = [{"size_bytes": 2 * MiB, "evictable": True, "lru_entries_touched_per_free": 1},
              {"size_bytes": 64 * MiB, "evictable": True, "lru_entries_touched_per_free": 32}]
    assert not bench.path_check(walked)["passed"]
