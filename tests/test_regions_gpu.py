"""Regions on a GPU (docs/regions.md; the issue's GPU checks): a 16 GiB region paused and resumed at
>= 90% of pinned cudaMemcpy each way; a CUDA graph captured over a region's tensors replays with
equal results after a pause and a resume; a model's weights paused while another model trains in the
memory they left, and its outputs unchanged after the resume. Skipped without a CUDA device (none
of these has run on a GPU yet: BENCHMARKS.md, "Regions", gives the cost model's prediction).

The torch tests run each in a fresh interpreter with enable(binding="native") before CUDA starts
(the allocator is chosen once per process; graph capture needs the native binding's graph pools).
"""

from __future__ import annotations

import statistics
import time

import pytest
from helpers.benchmarks import load_script
from helpers.subproc import run_python

pytestmark = pytest.mark.gpu

MiB, GiB = 1 << 20, 1 << 30


def test_a_16_GiB_region_pauses_and_resumes_at_90_percent_of_pinned_each_way():
    from vtalloc.allocator import AddressSpace

    bench = load_script("bench_regions")
    ref = bench.reference_copy("cuda", 2 * GiB, 3)  # pinned: flat from 256 MiB up; 2 GiB keeps host memory small
    pinned = {"d2h": ref["d2h"]["GBps"], "h2d": ref["h2d"]["GBps"]}
    sizes = bench.layout_sizes("model", 16 * GiB)  # a model's weights, loaded back to back
    total = sum(sizes)
    with AddressSpace(backend="cuda", capacity=total + GiB, host_capacity=total + GiB) as space:
        with space.region("weights"):
            addrs = [space.malloc(n) for n in sizes]
        # Up to a MiB of each tensor, bytes of its own: each must come back to its place.
        marks = {a: bytes([i % 251 + 1]) * min(n, MiB) for i, (a, n) in enumerate(zip(addrs, sizes))}
        for a, m in marks.items():
            space.write(a, m)
        pause, resume = [], []
        for _ in range(4):
            t0 = time.perf_counter()
            paused = space.pause("weights")
            pause.append(paused / (time.perf_counter() - t0) / 1e9)
            t0 = time.perf_counter()
            resumed = space.resume("weights")
            resume.append(resumed / (time.perf_counter() - t0) / 1e9)
            assert paused == resumed >= total
        for a, m in marks.items():
            assert space.read(a, len(m)) == m
        for a in addrs:
            space.free(a)
    # The first pause moves the handles the tensors were allocated on (a tensor after a small one is on
    # one-page handles); its resume maps the region on extents, which every later cycle moves: the
    # steady state of a loop that pauses each step. The first cycle's rates are in the message.
    print(f"first cycle: pause {pause[0]:.1f} GB/s, resume {resume[0]:.1f} GB/s; pinned {pinned}")
    p, r = statistics.median(pause[1:]), statistics.median(resume[1:])
    assert p >= 0.9 * pinned["d2h"], f"pause {p:.1f} GB/s, pinned d2h {pinned['d2h']:.1f} GB/s"
    assert r >= 0.9 * pinned["h2d"], f"resume {r:.1f} GB/s, pinned h2d {pinned['h2d']:.1f} GB/s"


GRAPH = """
import json
import torch
import vtalloc.allocator.torch as vt
vt.enable(binding="native", capacity="512MiB")
assert vt.binding().kind == "native", vt.binding()
torch.manual_seed(0)
with vt.region("graph"):
    x = torch.randn(4096, 4096, device="cuda")  # 64 MiB each
    w = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            (x @ w).relu()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # its private pool's blocks (the matmul's and relu's outputs) carry the tag
        y = (x @ w).relu().sum(dim=0)
g.replay()
torch.cuda.synchronize()
ref = y.clone()
try:
    torch.empty(400 * 2 ** 20, dtype=torch.uint8, device="cuda")
    fits_beside = True
except torch.OutOfMemoryError:
    fits_beside = False
freed = vt.pause("graph")
other = torch.empty(400 * 2 ** 20, dtype=torch.uint8, device="cuda")  # in the memory the region left
other.fill_(1)
torch.cuda.synchronize()
del other
vt.empty_cache()
vt.resume("graph")
y.zero_()
g.replay()
torch.cuda.synchronize()
print(json.dumps({"fits_beside": fits_beside, "freed": freed, "equal": bool(torch.equal(y, ref)),
                  "tags": [r.tag for r in vt.regions(0)]}))
"""


def test_a_cuda_graph_captured_over_a_regions_tensors_replays_equal_after_pause_and_resume(tmp_path):
    out = run_python(GRAPH, env={"VTALLOC_CACHE_DIR": str(tmp_path)})
    assert not out["fits_beside"] and out["freed"] >= 128 * MiB
    assert out["equal"] and out["tags"] == ["graph"]


TRAIN_BESIDE = """
import json
import torch
import vtalloc.allocator.torch as vt
vt.enable(binding="native", capacity="5GiB")
torch.manual_seed(0)

def mlp(width, depth):
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(depth)]).cuda()

with vt.region("policy"):
    policy = mlp(8192, 10)  # 2.5 GiB of fp32 weights
x = torch.randn(64, 8192, device="cuda")
with torch.no_grad():
    before = policy(x)
try:
    torch.empty(4 * 2 ** 30, dtype=torch.uint8, device="cuda")  # the trainer's weights and gradients
    fits_beside = True
except torch.OutOfMemoryError:
    fits_beside = False
vt.pause("policy")
trainer = mlp(8192, 8)  # 2 GiB of weights, 2 GiB of gradients: only in the memory the policy left
opt = torch.optim.SGD(trainer.parameters(), lr=1e-3)
for _ in range(3):
    opt.zero_grad(set_to_none=True)
    trainer(x).square().mean().backward()
    opt.step()
torch.cuda.synchronize()
del trainer, opt
vt.empty_cache()
vt.resume("policy", timeout=10)
with torch.no_grad():
    after = policy(x)
print(json.dumps({"fits_beside": fits_beside, "equal": bool(torch.equal(before, after))}))
"""


def test_a_models_weights_paused_while_another_trains_in_their_memory_give_equal_outputs_after_resume(tmp_path):
    out = run_python(TRAIN_BESIDE, env={"VTALLOC_CACHE_DIR": str(tmp_path), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert out == {"fits_beside": False, "equal": True}
