"""An out-of-memory under enable() is torch.OutOfMemoryError and the process goes on, under both
bindings, in every form a user meets it (issue 35).

On the H200 of 2026-11-28 every OOM under the torch-native binding was a SIGSEGV (the binding
formatted its message through an iostream; docs/design.md, "No iostreams in the core or the
binding"). Each case runs in a fresh process, since torch's allocator is chosen once per process:
an allocation over vtalloc's capacity, one inside an op, one over
``set_per_process_memory_fraction``, and a stored real model's allocation trace replayed under a
capacity below its peak (the batch-size finder's and the OOM-skipping loop's case: the replay is
cut at its OOM, everything it held is dropped, and the process trains on). Skipped without a
CUDA device.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.subproc import run_python

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[2])
import torch
import vtalloc.allocator.torch as vt
vt.enable(binding=sys.argv[1], capacity="1GiB")
assert vt.binding().kind == sys.argv[1], vt.binding()
import bench_trace
from lib import trace_format

out = {"binding": vt.binding().kind, "oom_exception": vt.oom_exception(), "caught": []}

def expect_oom(name, fn):
    try:
        fn()
        out["caught"].append([name, "no error"])
    except torch.OutOfMemoryError as e:
        out["caught"].append([name, "torch.OutOfMemoryError", str(e)[:400]])

# 1. Over capacity, as a new user meets it.
expect_oom("over_capacity", lambda: torch.empty(2 << 30, dtype=torch.uint8, device="cuda"))
# 2. Inside an op: 512 MiB held, x.double() needs 1 GiB more.
x = torch.ones(128 << 20, dtype=torch.float32, device="cuda")
expect_oom("inside_an_op", lambda: x.double())
del x
# 3. Over set_per_process_memory_fraction (a cap of 512 MiB, under the 1 GiB capacity), then lifted.
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction((512 << 20) / total)
expect_oom("over_fraction", lambda: torch.empty(768 << 20, dtype=torch.uint8, device="cuda"))
torch.cuda.set_per_process_memory_fraction(1.0)
y = torch.empty(768 << 20, dtype=torch.uint8, device="cuda")   # fits once the cap is lifted
out["after_lift"] = y.numel()
del y
# 4. A real model's trace replayed under a capacity below its peak live bytes (a capped replay
# ends at its first OOM and frees what it held), three times over: the process lives through each.
trace = trace_format.load(sys.argv[3])
peak = trace.peak_live_bytes()
torch.cuda.set_per_process_memory_fraction(min(1.0, 0.9 * peak / total))
replays = [bench_trace.replay_on_device(trace.events, bench_trace.TorchDevice(torch, vt)) for _ in range(3)]
torch.cuda.set_per_process_memory_fraction(1.0)
out["replays"] = [{"ok": r["ok"], "oom": r["oom"]} for r in replays]
# The process goes on: it trains, and what the OOMs left behind is all given back.
model = torch.nn.Linear(512, 512).cuda()
loss = model(torch.randn(64, 512, device="cuda")).square().mean()
loss.backward()
out["trained"] = bool(torch.isfinite(loss).item())
del model, loss
torch.cuda.synchronize()
# vtalloc's own figures: torch.cuda.memory_stats() is refused under PyTorch's pluggable interface
out["allocated_after"] = vt.memory_allocated(0)
out["num_ooms"] = vt.memory_stats()["num_ooms"]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {"VTALLOC_CACHE_DIR": str(tmp_path_factory.mktemp("binding-cache"))}


@pytest.mark.parametrize("binding", ["native", "pluggable"])
def test_every_out_of_memory_is_torch_out_of_memory_error_and_the_process_goes_on(env, binding):
    out = run_python(SCRIPT, binding, str(REPO / "benchmarks"), str(REPO / "benchmarks" / "traces" / "vit.json.gz"),
                     env=env)
    assert out["binding"] == binding and out["oom_exception"] == "torch.OutOfMemoryError"
    caught = {c[0]: c for c in out["caught"]}
    for name in ("over_capacity", "inside_an_op", "over_fraction"):
        assert caught[name][1] == "torch.OutOfMemoryError", caught[name]
        assert "vtalloc" in caught[name][2], caught[name]
    assert "2.00 GiB" in caught["over_capacity"][2] and "1.00 GiB" in caught["over_capacity"][2]
    assert [r["ok"] for r in out["replays"]] == [False, False, False], out["replays"]
    assert all("vtalloc" in r["oom"]["error"] for r in out["replays"]), out["replays"]
    assert out["after_lift"] == 768 << 20
    assert out["trained"]
    assert out["allocated_after"] == 0
    assert out["num_ooms"] >= 6
