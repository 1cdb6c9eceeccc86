"""Mapping changes never run under queued GPU work (docs/eviction.md, "Ordering").

The CUDA half of the CPU stress test in test_paging_under_kernels.py: a kernel queued on the
allocation's stream behind a long `torch.cuda._sleep` still reads the tensor when the
allocator would like to change its mapping (release the device page of an offloaded tensor
under pressure; swap a restored page in). The allocator must wait for it: the read returns
the right values and the CUDA context survives (an illegal address would end it). Fresh
interpreters: the allocator can be chosen once per process. Skipped without a CUDA device.
"""

from __future__ import annotations

import pytest

from helpers.subproc import run_python

pytestmark = pytest.mark.gpu

SCRIPT = """
import json, sys
import torch
import vtalloc.allocator.torch as vt
page = sys.argv[1]
vt.enable(evict_mode="mapped", capacity="512MiB", page_size=page)
MiB = 1 << 20
n = 64 * MiB // 4
x = torch.arange(n, dtype=torch.float32, device="cuda")
expect = float(x.double().sum())
checks = []
for round in range(8):
    # 1. release under pressure: a late read of an offloaded tensor is still queued
    vt.offload(x)
    torch.cuda._sleep(50_000_000)        # keep the stream busy for tens of ms
    late = x.double().sum()               # reads x's address after the offload
    hog = torch.empty(480 * MiB, dtype=torch.uint8, device="cuda")  # needs x's device pages
    checks.append(float(late) == expect)
    del hog
    # 2. restore swap: a read queued before the prefetch goes to the host copy; the swap waits
    torch.cuda._sleep(50_000_000)
    before = x.double().sum()
    vt.prefetch(x, wait=True)
    after = x.double().sum()
    checks.append(float(before) == expect and float(after) == expect)
torch.cuda.synchronize()
st = vt.stats()
print(json.dumps({"ok": all(checks), "n": len(checks), "evictions": st.evictions, "restores": st.restores,
                  "evict_mode": st.evict_mode}))
"""


@pytest.mark.parametrize("page", ["2MiB", "64MiB"])
def test_late_reads_survive_release_and_swap(page):
    out = run_python(SCRIPT, page, timeout=600)
    assert out["evict_mode"] == "mapped"
    assert out["ok"] and out["n"] == 16
    assert out["evictions"] > 0 and out["restores"] > 0
