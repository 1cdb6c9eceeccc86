"""Extent splits on a GPU (docs/design.md, "Blocks share pages"): the CUDA half of
tests/test_extent_splits.py, which runs on the host backend.

What it must show on a device: at the edge of an OOM under `enable()`, the extent two live
tensors use only in part is split; the tensors keep their addresses and values; the split
waits for a kernel still reading one of them on a stream the allocator was never told of
(`cuCtxSynchronize`: a live tensor may be read on any stream), so the read returns the right
sum and the CUDA context survives (an illegal address would end it). Fresh interpreter: the
allocator can be chosen once per process. Skipped without a CUDA device.
"""

from __future__ import annotations

import pytest

from helpers.subproc import run_python

pytestmark = pytest.mark.gpu

SCRIPT = """
import json
import torch
import vtalloc.allocator.torch as vt
MiB = 1 << 20
vt.enable(capacity="80MiB", extent_size="64MiB")
dev = torch.device("cuda")
big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
del big                                             # a cached 64 MiB extent
a = torch.empty(40 * MiB, dtype=torch.uint8, device=dev)   # reuses it in place (covers over half)
b = torch.arange((5 * MiB + 123) // 4, dtype=torch.int32, device=dev)  # on the rest of it
c = torch.full((3000,), 7, dtype=torch.uint8, device=dev)
addr_b, addr_c = b.data_ptr(), c.data_ptr()
expect_b, expect_c = int(b.long().sum()), int(c.long().sum())
torch.cuda.synchronize()
side = torch.cuda.Stream()                          # never named to the allocator for b
with torch.cuda.stream(side):
    torch.cuda._sleep(200_000_000)                  # hundreds of ms of queued work
    late = b.long().sum()                           # reads b's address after the sleep
before = vt.stats()
del a
hog = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)  # fits only if the extent is split
after = vt.stats()
side.synchronize()
ok = (int(late) == expect_b and b.data_ptr() == addr_b and c.data_ptr() == addr_c
      and int(b.long().sum()) == expect_b and int(c.long().sum()) == expect_c)
torch.cuda.synchronize()
print(json.dumps({"ok": ok, "splits": after.num_extent_splits - before.num_extent_splits,
                  "device_waits": after.num_device_synchronize_calls - before.num_device_synchronize_calls,
                  "binding": vt.binding().describe()}))
"""


def test_a_split_under_enable_keeps_tensors_and_waits_for_a_stream_it_was_not_told_of():
    out = run_python(SCRIPT, timeout=600)
    assert out["ok"], out
    assert out["splits"] >= 1 and out["device_waits"] >= 1, out
