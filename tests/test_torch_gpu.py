"""vtalloc as PyTorch's CUDA allocator, on a GPU. Each test runs its torch code in a fresh
interpreter (the allocator can be chosen only once per process) and checks the JSON it prints.
enable() takes the torch-native binding where it can be built; the tests of what only the
pluggable fallback refuses name binding="pluggable".

Skipped where vtalloc's cuda backend is unavailable (see conftest.py).
"""

from __future__ import annotations

import pytest

from helpers.sizes import MiB
from helpers.subproc import run_python

pytestmark = pytest.mark.gpu


# Shared by the training scripts: same seeds, deterministic kernels, no TF32, so that the only
# difference between two runs is the allocator (argv[1]: "native" or "vtalloc").
DETERMINISTIC = """
import json, sys
import torch
use_vtalloc = sys.argv[1] == "vtalloc"
if use_vtalloc:
    import vtalloc.allocator.torch as vt
    vt.enable()
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

def xent(logits, target):
    # cross_entropy without NLLLoss, which has no deterministic CUDA kernel (it would raise)
    onehot = torch.nn.functional.one_hot(target, logits.shape[-1]).to(logits.dtype)
    return -(torch.log_softmax(logits, dim=-1) * onehot).sum(dim=-1).mean()

def report(out):
    if use_vtalloc:
        out["vtalloc"] = vt.memory_stats()
    print(json.dumps(out))
"""
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}

MLP = DETERMINISTIC + """
model = torch.nn.Sequential(
    torch.nn.Linear(256, 512), torch.nn.ReLU(),
    torch.nn.Linear(512, 512), torch.nn.ReLU(),
    torch.nn.Linear(512, 10),
).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
x = torch.randn(128, 256, device="cuda")
y = torch.randint(0, 10, (128,), device="cuda")
losses = []
for _ in range(6):
    opt.zero_grad(set_to_none=True)
    loss = xent(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
report({"losses": losses})
"""

TRANSFORMER = DETERMINISTIC + """
from torch.nn.attention import SDPBackend, sdpa_kernel
vocab, d = 100, 64
layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(vocab, d), "enc": encoder, "head": torch.nn.Linear(d, vocab)}).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
tokens = torch.randint(0, vocab, (8, 32), device="cuda")
targets = torch.roll(tokens, -1, dims=1)
losses = []
with sdpa_kernel(SDPBackend.MATH):
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        logits = model["head"](model["enc"](model["emb"](tokens)))
        loss = xent(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
report({"losses": losses})
"""


@pytest.mark.parametrize("script", [MLP, TRANSFORMER], ids=["mlp", "transformer"])
def test_training_losses_match_the_native_allocator(script):
    native = run_python(script, "native", env=DETERMINISTIC_ENV)
    paged = run_python(script, "vtalloc", env=DETERMINISTIC_ENV)
    assert paged["losses"] == native["losses"]  # bit for bit: only the allocator differs
    assert native["losses"][-1] < native["losses"][0]  # it did train
    stats = paged["vtalloc"]
    assert stats["allocation.all.allocated"] > 0  # vtalloc really served the run
    assert stats["allocation.all.current"] > 0  # parameters and optimizer state are still live
    assert stats["num_ooms"] == 0 and stats["vtalloc.alloc_failures"] == 0 and stats["vtalloc.free_failures"] == 0


def test_mixed_streams():
    """Record_stream is refused with the wait_stream advice: the pluggable binding (the fallback where the torch-native one cannot be built), named
    explicitly since enable() takes the native binding where it can (its counterpart:
    tests/test_torch_binding_gpu.py, record_stream works)."""
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        vt.enable(binding="pluggable")
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        a = torch.randn(1 << 20, device="cuda")
        baseline = vt.memory_stats(0)["allocation.all.current"] - 1   # whatever torch keeps, less `a`
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b = a * 2                      # allocated on the side stream
            c = torch.empty_like(a)
            c.copy_(b + 1)
        main.wait_stream(side)
        first_ok = torch.equal(c, a * 2 + 1)   # main reads memory allocated on side
        side.wait_stream(main)                 # the documented pattern instead of record_stream
        del b, c
        ok = []
        for i in range(50):
            with torch.cuda.stream(side):
                t = torch.full((1 << 18,), float(i), device="cuda")
                u = t + 1
            main.wait_stream(side)
            v = u * 2                          # on main, reading side-stream memory
            side.wait_stream(main)             # u may be freed only after main is done with it
            del t, u
            ok.append(v[0].item() == (i + 1) * 2)
            del v
        torch.cuda.synchronize()
        refused = ""
        try:
            a.record_stream(side)
        except vt.UnsupportedError as e:
            refused = str(e)
        del a
        torch.cuda.synchronize()
        print(json.dumps({"first_ok": first_ok, "ok": all(ok), "refused": refused, "stats": vt.memory_stats(0),
                          "baseline": baseline}))
    """)
    assert out["first_ok"] and out["ok"]
    assert "wait_stream" in out["refused"]
    assert out["stats"]["allocation.all.current"] == out["baseline"]  # everything went back
    assert out["stats"]["allocation.all.allocated"] > 100  # both streams allocated through vtalloc
    assert out["stats"]["vtalloc.free_failures"] == 0


def test_mempool_scopes_allocations():
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        pool = vt.mempool(capacity="2GiB")
        with torch.cuda.use_mem_pool(pool):
            x = torch.arange(4 << 20, device="cuda", dtype=torch.float32)   # 16 MiB, in the pool
        outside_before = vt.memory_stats()["requested_bytes.all.current"]
        y = torch.ones(1 << 20, device="cuda")                             # native, not vtalloc
        outside_after = vt.memory_stats()["requested_bytes.all.current"]
        total = float(x.sum() + y.sum())
        conflict = ""
        try:
            vt.enable()
        except vt.AllocatorConflictError as e:
            conflict = str(e)
        same_pool_options = vt.mempool(capacity="2GiB") is not None
        other = ""
        try:
            vt.mempool(capacity="1GiB")
        except vt.AllocatorConflictError as e:
            other = str(e)
        del x
        torch.cuda.synchronize()
        print(json.dumps({"served": outside_before, "unchanged": outside_after == outside_before,
                          "total": total, "conflict": conflict, "same": same_pool_options, "other": other,
                          "mode": vt.mode()}))
    """)
    assert out["served"] >= 16 * MiB  # the pool's segment came from vtalloc
    assert out["unchanged"]  # allocations outside use_mem_pool did not
    n = 4 << 20
    assert out["total"] == pytest.approx(n * (n - 1) / 2 + (1 << 20), rel=1e-6)
    assert "either enable() or mempool()" in out["conflict"]
    assert out["same"] and "one vtalloc configuration per process" in out["other"]
    assert out["mode"] == "mempool"


def test_out_of_memory_is_torch_out_of_memory_error_and_the_process_goes_on():
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        vt.enable(capacity="256MiB")
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        messages = []
        try:
            torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            messages.append(str(e))
        try:
            x.float()                       # inside an op: 256 MiB more than fits
        except torch.OutOfMemoryError as e:
            messages.append(str(e))
        a = torch.ones(1024, device="cuda")
        usable = a.sum().item() == 1024.0
        del x
        big = torch.empty(200 << 20, dtype=torch.uint8, device="cuda")   # fits again once x is gone
        big.fill_(7)
        torch.cuda.synchronize()
        print(json.dumps({"messages": messages, "usable": usable, "big_ok": int(big[-1]) == 7,
                          "kind": vt.oom_exception(), "failures": vt.failures(0).ooms,
                          "num_ooms": vt.memory_stats()["num_ooms"]}))
    """)
    assert out["kind"] == "torch.OutOfMemoryError"
    assert len(out["messages"]) == 2
    assert "vtalloc" in out["messages"][0] and "512.00 MiB" in out["messages"][0] and "capacity 256.00 MiB" in out["messages"][0]
    assert "vtalloc" in out["messages"][1]
    assert out["usable"] and out["big_ok"]
    assert out["failures"] == 2 and out["num_ooms"] == 2


def test_enable_after_cuda_is_initialized_is_refused_clearly():
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        torch.zeros(1, device="cuda")
        try:
            vt.enable()
            message = ""
        except vt.AllocatorConflictError as e:
            message = str(e)
        print(json.dumps({"message": message, "mode": vt.mode()}))
    """)
    assert "before the first CUDA tensor" in out["message"]
    assert out["mode"] is None


def test_enable_twice_same_options_is_harmless_other_options_refused():
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        first = vt.enable(capacity="1GiB")
        t = torch.ones(10, device="cuda")
        again = vt.enable(capacity="1GiB")
        try:
            vt.enable(capacity="2GiB")
            other = ""
        except vt.AllocatorConflictError as e:
            other = str(e)
        print(json.dumps({"same": first == again, "other": other, "sum": t.sum().item()}))
    """)
    assert out["same"] and out["sum"] == 10.0
    assert "cannot switch" in out["other"]


def test_cuda_graph_without_allocation_works_allocation_during_capture_is_refused():
    """Allocation during capture is refused: the pluggable binding (the fallback where the torch-native one cannot be built), named
    explicitly since enable() takes the native binding where it can (its counterpart:
    tests/test_torch_binding_gpu.py, captured graphs with their pools)."""
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        vt.enable(binding="pluggable")
        x = torch.randn(1024, device="cuda")
        y = torch.empty_like(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.mul(x, 2, out=y)          # warm up
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.mul(x, 2, out=y)          # captures a kernel, allocates nothing
        x.fill_(3.0)
        g.replay()
        torch.cuda.synchronize()
        replay_ok = bool((y == 6.0).all())
        refused = ""
        g2 = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g2):
                z = x * 2                   # needs an allocation during capture
        except RuntimeError as e:
            refused = str(e)
        w = x + 1                           # the process is still usable
        torch.cuda.synchronize()
        print(json.dumps({"replay_ok": replay_ok, "refused": refused, "after": float(w[0]),
                          "refusals": vt.failures(0).capture_refusals}))
    """)
    assert out["replay_ok"]
    assert "CUDA graph" in out["refused"]
    assert out["after"] == 4.0
    assert out["refusals"] >= 1


def test_cudnn_benchmark_is_refused_at_enable_and_fails_clearly_later():
    """Cudnn.benchmark is refused: the pluggable binding (the fallback where the torch-native one cannot be built), named
    explicitly since enable() takes the native binding where it can (its counterpart:
    tests/test_torch_binding_gpu.py, cudnn.benchmark works)."""
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        torch.backends.cudnn.benchmark = True
        try:
            vt.enable(binding="pluggable")
            at_enable = ""
        except vt.AllocatorConflictError as e:
            at_enable = str(e)
        torch.backends.cudnn.benchmark = False
        vt.enable(binding="pluggable")
        conv = torch.nn.Conv2d(3, 8, 3).cuda()
        x = torch.randn(2, 3, 16, 16, device="cuda")
        y = conv(x)                       # cudnn without benchmark: works, and computes the convolution
        ref = torch.nn.functional.conv2d(x.cpu(), conv.weight.detach().cpu(), conv.bias.detach().cpu())
        plain = y.sum().item()
        plain_ok = bool(torch.allclose(y.detach().cpu(), ref, rtol=1e-2, atol=1e-2))
        torch.backends.cudnn.benchmark = True
        try:
            conv(torch.randn(2, 3, 20, 20, device="cuda"))
            later = ""
        except RuntimeError as e:
            later = str(e)
        print(json.dumps({"at_enable": at_enable, "plain": plain, "plain_ok": plain_ok, "later": later}))
    """)
    assert "cudnn.benchmark" in out["at_enable"]
    assert isinstance(out["plain"], float) and out["plain_ok"]  # same as the CPU convolution (TF32 tolerance)
    assert "cacheInfo" in out["later"]  # PyTorch's own refusal (CUDAPluggableAllocator)


def test_torch_compile_default_mode_matches_eager():
    out = run_python("""
        import json
        import torch
        import vtalloc.allocator.torch as vt
        vt.enable()
        try:
            import triton  # noqa: F401
        except ImportError as e:
            print(json.dumps({"skip": f"no triton: {e}"}))
            raise SystemExit(0)
        def f(x, w):
            return torch.nn.functional.gelu(x @ w) * 2 + x.sum(dim=1, keepdim=True)
        x = torch.randn(64, 64, device="cuda")
        w = torch.randn(64, 64, device="cuda")
        compiled = torch.compile(f)
        got = compiled(x, w)
        print(json.dumps({"close": torch.allclose(got, f(x, w), rtol=1e-4, atol=1e-4),
                          "served": vt.memory_stats()["allocation.all.allocated"]}))
    """, timeout=900)
    if "skip" in out:
        pytest.skip(out["skip"])
    assert out["close"] and out["served"] > 0


def test_two_devices_each_get_a_space_and_the_current_device_is_kept():
    out = run_python("""
        import json
        import torch
        if torch.cuda.device_count() < 2:
            print(json.dumps({"skip": "needs two GPUs"}))
            raise SystemExit(0)
        import vtalloc.allocator.torch as vt
        vt.enable()
        torch.cuda.set_device(0)
        a = torch.randn(1 << 20, device="cuda:0")
        b = a.to("cuda:1")                     # allocated in device 1's space
        same = torch.equal(b.cpu(), a.cpu())
        t = torch.empty(10, device="cuda:1")
        del t                                   # freed on device 1 while device 0 is current
        still_zero = torch.cuda.current_device() == 0
        print(json.dumps({"same": same, "still_zero": still_zero,
                          "dev0": vt.memory_stats(0)["allocation.all.current"],
                          "dev1": vt.memory_stats(1)["allocation.all.current"]}))
    """)
    if "skip" in out:
        pytest.skip(out["skip"])
    assert out["same"] and out["still_zero"]
    assert out["dev0"] >= 1 and out["dev1"] >= 1
