"""benchmarks/bench_regions.py (pause and resume of a tagged region): its quick form runs on the host
backend and under the h100 cost model, and each row's path check fails on another path's counters."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.benchmarks import BENCH, load_script
from helpers.sizes import MiB


def run_quick(tmp_path, *args: str) -> dict:
    out = tmp_path / "regions.json"
    subprocess.run([sys.executable, str(BENCH / "bench_regions.py"), "--quick", *args, "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.read_text())


def test_the_quick_form_measures_and_predicts_pause_and_resume_with_a_few_calls_per_gib(tmp_path):
    for args, predicted in (((), False), (("--cost-model", "h100"), True)):
        record = run_quick(tmp_path, *args)
        assert record["path_checked"]["passed"] and record["path_checked"]["rows_checked"] == 3
        one = record["rows"][0]
        assert one["layout"] == "one" and one["region_bytes"] == 64 * MiB
        # One 64 MiB extent: one copy, one unmap, one release out; one create, map, set-access, copy back.
        assert one["pause_calls_per_GiB"]["num_copy_calls"] == 16 and one["resume_calls_per_GiB"]["num_map_calls"] == 16
        assert record["rows"][2]["pause_calls_per_GiB"]["num_copy_calls"] == 0  # discard copies nothing
        assert ("pause_share_of_model_pinned" in one) == predicted
        if predicted:
            assert 0.5 < one["pause_share_of_model_pinned"] <= 1.0 and 0.5 < one["resume_share_of_model_pinned"] <= 1.0


def test_a_row_that_did_not_pause_or_resume_fails_its_check():
    br = load_script("bench_regions")
    good = {"paused_bytes": 64 * MiB, "host_bytes": 64 * MiB, "pages_held_while_paused": 0,
            "resumed_page_bytes": 64 * MiB, "paused_page_bytes": 64 * MiB, "paused_bytes_after_resume": 0,
            "bytes_intact": True}
    assert br.region_check("one", False, 64 * MiB, good)["passed"]
    c = br.region_check("one", False, 64 * MiB, {**good, "pages_held_while_paused": 32})  # nothing left the device
    assert c["mismatches"] == ["pages_held_while_paused=32 (expected 0)"]
    c = br.region_check("one", True, 64 * MiB, good)  # a discard that kept a host copy
    assert c["mismatches"] == ["host_bytes=67108864 (expected 0)"]
    c = br.region_check("one", False, 64 * MiB, {**good, "paused_bytes_after_resume": 64 * MiB, "bytes_intact": False})
    assert not c["passed"] and len(c["mismatches"]) == 2
