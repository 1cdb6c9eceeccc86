"""The copy-path probe (benchmarks/probe_copy_paths.py) on a CPU: its verdict, split plan and %
arithmetic, its whole driver path against a simulated driver, its exits without cuda-python,
a driver or a device; and, on a GPU, one quick real run.

Owns: these checks. The missing-driver runs put a stub `cuda` package first on PYTHONPATH
(import fails, cuInit raises as cuda-python does without libcuda, cuInit returns an error), so
they mean the same on a machine with a GPU.
Invariants: no timing is asserted on a CPU; the GPU test asserts only that pinned copies ran
faster than 1 GB/s both ways.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fake_cuda_driver
from helpers.fake_cuda_driver import FakeDriver
from helpers.sizes import MiB

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import probe_copy_paths

    return probe_copy_paths


def row(target, method, streams, size, direction, gbps, status="ok"):
    r = {"target": target, "method": method, "streams": streams, "size_bytes": size, "direction": direction,
         "load": "idle", "status": status}
    return r | ({"gbps": gbps} if status == "ok" else {"error": "CUDA_ERROR_INVALID_VALUE"})


def both_ways(target, method, streams, rates):
    """Rows for both directions; rates: {size: (evict GB/s, restore GB/s)}."""
    return [row(target, method, streams, size, d, g) for size, pair in rates.items()
            for d, g in zip(("evict", "restore"), pair)]


PINNED = both_ways("pinned", "memcpy_async", 1, {2 * MiB: (50.0, 50.0), 32 * MiB: (55.0, 55.0), 256 * MiB: (55.0, 55.0)})


# -- verdict ---------------------------------------------------------------------------------
def test_verdict_picks_the_path_whose_worst_judged_size_is_best(probe):
    rows = PINNED + both_ways("pinned", "batch_ce", 2, {32 * MiB: (60.0, 60.0), 256 * MiB: (60.0, 60.0)}) + [
        # fastest at 256 MiB but 80% at 32 MiB: its judged score is 80
        *both_ways("host_numa", "memcpy_async", 1, {32 * MiB: (44.0, 54.0), 256 * MiB: (54.0, 54.5)}),
        # 92.7% at both judged sizes; slow at 2 MiB, which is not judged
        *both_ways("host_numa", "batch_ce", 1, {2 * MiB: (10.0, 10.0), 32 * MiB: (51.0, 50.0),
                                                256 * MiB: (51.0, 53.0)}),
        # faster at 32 MiB, refused at 256 MiB: not a candidate
        row("host", "batch_ce", 2, 32 * MiB, "evict", 54.0), row("host", "batch_ce", 2, 256 * MiB, "evict", None, "refused"),
    ]
    v = probe.verdict(rows)
    e = v["evict"]
    assert e["best"] == {"target": "host_numa", "method": "batch_ce", "streams": 1}
    assert e["pct_of_pinned"] == 92.7 and e["reaches_threshold"] is True
    assert e["judged_sizes"] == [32 * MiB, 256 * MiB]
    assert e["by_target"]["host_numa"]["method"] == "batch_ce" and "host" not in e["by_target"]
    r = v["restore"]  # restore: memcpy_async 98.2 / 99.1 beats batch_ce 90.9 / 96.4
    assert r["best"] == {"target": "host_numa", "method": "memcpy_async", "streams": 1}
    assert r["pct_of_pinned"] == 98.2 and r["reaches_threshold"]


def test_verdict_says_no_when_nothing_reaches_the_threshold(probe):
    rows = PINNED + both_ways("host_numa", "memcpy_async", 1, {32 * MiB: (36.0, 54.0), 256 * MiB: (37.0, 54.0)}) + [
        row("host_numa_current", "memcpy_async", 1, 32 * MiB, "evict", None, "refused"),
        row("host", "batch_ce", 4, 32 * MiB, "evict", 44.0), row("host", "batch_ce", 4, 256 * MiB, "evict", 45.0),
    ]
    e = probe.verdict(rows)["evict"]
    assert e["best"] == {"target": "host", "method": "batch_ce", "streams": 4}
    assert e["pct_of_pinned"] == 80.0 and e["reaches_threshold"] is False
    assert probe.verdict(rows)["restore"]["reaches_threshold"] is True
    lines = probe.verdict_lines(probe.verdict(rows))
    assert lines[0].startswith("VERDICT evict: best non-pinned path host / batch_ce / 4") and lines[0].endswith("NO")


def test_verdict_without_a_pinned_reference_or_a_candidate_says_why(probe):
    only_pinned = probe.verdict(PINNED)["evict"]
    assert only_pinned["best"] is None and "no non-pinned path" in only_pinned["why"]
    no_ref = probe.verdict(both_ways("host_numa", "memcpy_async", 1, {32 * MiB: (50.0, 50.0)}))["restore"]
    assert no_ref["best"] is None and "no pinned reference" in no_ref["why"] and not no_ref["reaches_threshold"]


def test_rows_under_load_are_not_judged_but_get_a_percentage(probe):
    loaded = row("host_numa", "batch_ce", 1, 256 * MiB, "evict", 55.0) | {"load": "matmul"}
    rows = PINNED + [loaded]
    assert probe.verdict(rows)["evict"]["best"] is None
    assert probe.with_pct(rows)[-1]["pct_of_pinned"] == 100.0


def test_pct(probe):
    assert probe.pct(34.4, 54.9) == 62.7
    assert probe.pct(None, 54.9) is None and probe.pct(30.0, None) is None and probe.pct(30.0, 0.0) is None


# -- split plan and sizes --------------------------------------------------------------------
@pytest.mark.parametrize("nbytes", [1, 7, 4095, 4097, 2 * MiB + 1, 32 * MiB - 3, 256 * MiB + 12345])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@pytest.mark.parametrize("align", [1, 4096, 65536])
def test_split_plan_covers_every_byte_once(probe, nbytes, parts, align):
    plan = probe.split_plan(nbytes, parts, align)
    assert 1 <= len(plan) <= parts
    assert plan[0][0] == 0 and all(n > 0 for _, n in plan)
    assert all(a + n == b for (a, n), (b, _) in zip(plan, plan[1:])), "gap or overlap"
    assert plan[-1][0] + plan[-1][1] == nbytes
    assert all(off % align == 0 for off, _ in plan)


def test_split_plan_refuses_nonsense(probe):
    for args in ((0, 2), (10, 0), (10, 2, 0)):
        with pytest.raises(ValueError):
            probe.split_plan(*args)


def test_parse_sizes(probe):
    assert probe.parse_sizes("2MiB, 32MiB,1GiB,4096") == (2 * MiB, 32 * MiB, 1 << 30, 4096)
    for bad in ("", "32MB", "0MiB", "x"):
        with pytest.raises(Exception, match="size"):
            probe.parse_sizes(bad)


# -- the whole probe against a simulated driver ----------------------------------------------
RATES = {(kind, d, m): 55.0 if kind == "pinned" or d == "restore" else (52.0 if m == "batch_ce" else 36.0)
         for kind in ("pinned", "host_page") for d in ("evict", "restore") for m in ("memcpy_async", "batch", "batch_ce")}


def test_the_probe_runs_every_path_records_refusals_and_releases_everything(probe, monkeypatch, tmp_path, capsys):
    fake = FakeDriver(RATES)
    monkeypatch.setattr(probe, "load_driver", lambda: fake)
    out = tmp_path / "probe.json"
    assert probe.main(["--sizes", "2MiB,32MiB", "--reps", "2", "--with-compute", "--out", str(out)]) == 0
    assert fake.held() == {}, "the probe left driver objects alive"
    rec = json.loads(out.read_text())
    assert rec["benchmark"] == "probe_copy_paths" and rec["device"]["name"] == "Fake H100"
    assert {"machine", "git", "date", "command"} <= rec["provenance"].keys()
    refused = {(r["target"], r["call"], r["error"]) for r in rec["refusals"]}
    assert refused == {("host_numa_current", "cuMemCreate", "CUDA_ERROR_INVALID_VALUE"),
                       ("host_numa_cpu", "cuMemSetAccess (device + HOST_NUMA)", "CUDA_ERROR_NOT_SUPPORTED")}
    measured = {(r["target"], r["method"], r["streams"], r["size_bytes"], r["direction"]) for r in rec["rows"]}
    assert len(measured) == len(rec["rows"]) == 3 * 3 * 3 * 2 * 2  # pinned, host_numa, host x methods x streams x sizes x dirs
    assert {m for _, m, *_ in measured} == {"memcpy_async", "batch", "batch_ce"}
    assert {(kind, d, m) for kind, d, m, _ in fake.copies} == {k for k in RATES}, "a method or direction was not issued"
    by = {(r["target"], r["method"], r["streams"], r["size_bytes"], r["direction"]): r for r in rec["rows"]}
    assert by[("host_numa", "memcpy_async", 1, 32 * MiB, "evict")]["pct_of_pinned"] == 65.5
    assert by[("host", "batch", 4, 32 * MiB, "restore")]["pct_of_pinned"] == 100.0  # one link: streams add nothing
    assert len(by[("pinned", "batch_ce", 2, 2 * MiB, "evict")]["event_ms"]) == 2
    v = rec["verdict"]
    assert v["evict"]["best"]["method"] == "batch_ce" and v["evict"]["pct_of_pinned"] == 94.5
    assert v["evict"]["reaches_threshold"] and v["restore"]["reaches_threshold"]
    assert rec["compute_load"] == {"skipped": "torch cannot use the GPU: torch.cuda.is_available: False"}
    printed = capsys.readouterr().out
    assert "VERDICT evict: best non-pinned path" in printed and "VERDICT restore:" in printed
    assert "refused: target=host_numa_current" in printed
    # the life of one handle, timed call by call, device and host-located, at each size
    calls = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease"}
    rows = rec["mapping_calls"]
    assert [(r["location"], r["size_bytes"]) for r in rows] == [
        (loc, size) for loc in ("device", "host_numa") for size in (2 * MiB, 32 * MiB)]
    assert all(r["status"] == "ok" and set(r["median_us"]) == calls and all(len(v) == r["reps"] for v in r["us"].values())
               for r in rows)
    assert "mapping calls, median wall us" in printed


def test_a_spent_time_budget_records_the_rest_as_skipped(probe, monkeypatch, tmp_path):
    fake = FakeDriver(RATES, host_numa_access=True)
    monkeypatch.setattr(probe, "load_driver", lambda: fake)
    out = tmp_path / "probe.json"
    assert probe.main(["--quick", "--max-seconds", "0", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["rows"] == [] and fake.held() == {}
    assert rec["mapping_calls"] and all(r["status"] == "skipped" for r in rec["mapping_calls"])
    skipped = [r for r in rec["refusals"] if r["step"] == "skipped"]
    assert len(skipped) == 4 * 3 * 2 * 1 * 2  # host_numa_cpu made (access granted) x methods x streams x size x dirs
    assert rec["verdict"]["evict"]["best"] is None


def test_a_python_error_in_one_method_is_recorded_and_the_run_goes_on(probe, monkeypatch, tmp_path):
    """As a cuda-python whose cuMemcpyBatchAsync takes other arguments would raise TypeError."""
    fake = FakeDriver(RATES)

    def other_signature(*args):
        raise TypeError("cuMemcpyBatchAsync() takes 7 positional arguments but 8 were given")

    monkeypatch.setattr(fake, "cuMemcpyBatchAsync", other_signature)
    monkeypatch.setattr(probe, "load_driver", lambda: fake)
    out = tmp_path / "probe.json"
    assert probe.main(["--quick", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert fake.held() == {}
    ok = [r for r in rec["rows"] if r["status"] == "ok"]
    refused = [r for r in rec["rows"] if r["status"] == "refused"]
    assert {r["method"] for r in ok} == {"memcpy_async"} and {r["method"] for r in refused} == {"batch", "batch_ce"}
    assert all(r["error"].startswith("TypeError: cuMemcpyBatchAsync() takes") for r in refused)
    assert {r["call"] for r in rec["refusals"] if r["step"] == "copy"} == {"python"}
    assert rec["verdict"]["evict"]["best"]["method"] == "memcpy_async"


# -- without cuda-python, a driver or a device -----------------------------------------------
STUBS = {
    "no cuda-python": ("raise ImportError('No module named cuda.bindings (stub)')", "", "cuda-python is not installed"),
    "no libcuda": ("", "def cuInit(flags):\n    raise RuntimeError('libcuda.so.1 could not be loaded\\n(stub)')\n",
                   "no CUDA driver: cuInit could not run (RuntimeError: libcuda.so.1 could not be loaded (stub))"),
    "no device": ("", "import enum\nclass CUresult(enum.IntEnum):\n    CUDA_SUCCESS = 0\n    CUDA_ERROR_NO_DEVICE = 100\n"
                      "def cuInit(flags):\n    return (CUresult.CUDA_ERROR_NO_DEVICE,)\n",
                  "cuInit returned CUDA_ERROR_NO_DEVICE"),
}


@pytest.mark.parametrize("case", STUBS)
def test_without_a_driver_it_exits_2_with_one_line(tmp_path, case):
    init, driver, says = STUBS[case]
    pkg = tmp_path / "cuda" / "bindings"
    pkg.mkdir(parents=True)
    (tmp_path / "cuda" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(init + "\n")
    (pkg / "driver.py").write_text(driver)
    p = subprocess.run([sys.executable, str(BENCH / "probe_copy_paths.py"), "--out", str(tmp_path / "x.json")],
                       capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"})
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout == "" and len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("probe_copy_paths: ") and says in p.stderr
    assert not (tmp_path / "x.json").exists()


def test_help_works_without_a_driver(tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "__init__.py").write_text("raise ImportError('stub')\n")
    p = subprocess.run([sys.executable, str(BENCH / "probe_copy_paths.py"), "--help"], capture_output=True, text=True,
                       timeout=60, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"})
    assert p.returncode == 0 and "--quick" in p.stdout and "--with-compute" in p.stdout and "Exit status 2" in p.stdout


# -- on a GPU --------------------------------------------------------------------------------
@pytest.mark.gpu
def test_a_quick_probe_on_the_gpu_measures_pinned_copies_both_ways(tmp_path):
    out = tmp_path / "probe.json"
    p = subprocess.run([sys.executable, str(BENCH / "probe_copy_paths.py"), "--quick", "--sizes", "32MiB", "--out",
                        str(out)], capture_output=True, text=True, timeout=300, cwd=BENCH.parent)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = json.loads(out.read_text())
    pinned = {r["direction"]: r["gbps"] for r in rec["rows"]
              if (r["target"], r["method"], r["streams"], r.get("status")) == ("pinned", "memcpy_async", 1, "ok")}
    assert pinned.keys() == {"evict", "restore"} and all(g > 1.0 for g in pinned.values()), pinned
    assert set(rec["verdict"]) == {"evict", "restore"}


def test_a_refused_mapping_call_is_recorded_and_its_handle_given_back(probe, monkeypatch, tmp_path):
    fake = FakeDriver(RATES)
    real_set_access, timing = fake.cuMemSetAccess, {"on": False}

    def refuse_host_pages(va, size, descs, count):  # once the mapping calls are timed: host pages refused
        if timing["on"] and fake.live["map"].get(int(va), ("",))[0] == "host_page":
            return (fake_cuda_driver.CUresult.CUDA_ERROR_INVALID_VALUE,)
        return real_set_access(va, size, descs, count)

    real_mapping_calls = probe.mapping_calls

    def mapping_calls(*args, **kwargs):
        timing["on"] = True
        return real_mapping_calls(*args, **kwargs)

    monkeypatch.setattr(fake, "cuMemSetAccess", refuse_host_pages)
    monkeypatch.setattr(probe, "mapping_calls", mapping_calls)
    monkeypatch.setattr(probe, "load_driver", lambda: fake)
    out = tmp_path / "probe.json"
    assert probe.main(["--quick", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert fake.held() == {}, "a refused grant left a handle mapped or alive"
    status = {r["location"]: r["status"] for r in rec["mapping_calls"]}
    assert status == {"device": "ok", "host_numa": "refused"}
    assert any(r["step"] == "mapping_calls" and r["call"] == "cuMemSetAccess" and r["target"] == "host_numa"
               for r in rec["refusals"])
