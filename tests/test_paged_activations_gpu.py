"""paged_activations on a GPU: torch's own CUDA tensors paged in place (vtalloc as torch's
allocator, mapped eviction mode), losses identical to native training. Each run is a fresh
interpreter (the allocator can be chosen once per process). Skipped without a CUDA device.
"""

from __future__ import annotations

import pytest

from helpers.subproc import run_python

pytestmark = pytest.mark.gpu

SCRIPT = """
import json, sys
import torch
paged = sys.argv[1] == "paged"
if paged:
    import vtalloc.allocator.torch as vt
    from vtalloc.allocator.torch import paged_activations
    vt.enable(evict_mode="mapped", capacity="1GiB")
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU()) for _ in range(12)],
                            torch.nn.Linear(1024, 1)).cuda()
x = torch.randn(4096, 1024, device="cuda")
y = torch.randn(4096, 1, device="cuda")
pager = paged_activations(budget="64MiB") if paged else None
losses = []
for _ in range(4):
    model.zero_grad(set_to_none=True)
    if paged:
        with pager:
            loss = torch.nn.functional.mse_loss(model(x), y)
    else:
        loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    losses.append(loss.item())
    grads = [float(p.grad.double().sum()) for p in model.parameters()]
out = {"losses": losses, "grads": grads}
if paged:
    st = vt.stats()
    ps = pager.stats()
    out.update(evictions=st.evictions, restores=st.restores, offloads=ps.offloads, prefetches=ps.prefetches,
               evict_mode=st.evict_mode)
print(json.dumps(out))
"""


def test_in_place_paging_matches_native_training():
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    native = run_python(SCRIPT, "native", env=env)
    paged = run_python(SCRIPT, "paged", env=env)
    assert paged["evict_mode"] == "mapped"
    assert paged["losses"] == native["losses"]
    assert paged["grads"] == native["grads"]
    assert paged["offloads"] > 0 and paged["evictions"] > 0 and paged["restores"] > 0


TENSOR_FORMS = """
import json
import torch
import vtalloc.allocator.torch as vt
vt.enable()
t = torch.arange(1 << 22, dtype=torch.float32, device="cuda")
ptr = t.data_ptr()
vt.offload(t)
torch.cuda.synchronize()
vt.prefetch(t, wait=True)
same = bool(torch.equal(t, torch.arange(1 << 22, dtype=torch.float32, device="cuda")))
st = vt.stats()
print(json.dumps({"same": same, "ptr_same": t.data_ptr() == ptr, "evictions": st.evictions, "restores": st.restores}))
"""


def test_tensor_forms_of_offload_and_prefetch_on_cuda():
    out = run_python(TENSOR_FORMS)
    assert out["same"] and out["ptr_same"]
    assert out["evictions"] >= 8 and out["restores"] >= 8  # 16 MiB in 2 MiB pages
