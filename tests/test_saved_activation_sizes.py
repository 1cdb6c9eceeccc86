"""benchmarks/saved_activation_sizes.py: its Python copy of the core's placement rule and its
per-handle call counts agree with a real host-backend AddressSpace, and its report adds up.

Owns: the checks of backing() (shared block / one-page handles / extents, with their sizes) against
pages() and the driver-call counters for a sweep of sizes at default settings and at 32 and 64
MiB pages; of MAPPED_CYCLE_CALLS against a steady-state mapped-mode evict + restore; a run
of the script on the tiny smoke models; and the ResNet-50 stand-in (for where torchvision does not
import) against what torchvision's model saved.
Invariants: CPU only, no GPU figure is checked; every space is closed (conftest checks pages
and pinned bytes return to zero).
"""

from __future__ import annotations

import json

import pytest

from helpers.benchmarks import BENCH, load_script
from helpers.sizes import MiB
from vtalloc.allocator import AddressSpace

sas = load_script("saved_activation_sizes")
SWEEP = {  # placement -> sizes (1 GiB at default settings only: the host backend really maps it)
    "default": [4096, MiB, MiB + 1, 3 * MiB, 30 * MiB, 31 * MiB, 32 * MiB, 32 * MiB + 1, 100 * MiB, 300 * MiB,
                1024 * MiB],
    "page2": [3 * MiB, 100 * MiB],
    "page32": [4096, 3 * MiB, 31 * MiB, 32 * MiB, 100 * MiB, 300 * MiB],
    "page64": [3 * MiB, 100 * MiB, 300 * MiB],
}


def space_for(p, size: int, **kw) -> AddressSpace:
    cap = -(-size // p.page_bytes) * p.page_bytes + 2 * p.page_bytes
    return AddressSpace(backend="host", capacity=cap, page_size=p.page_bytes, extent_size=p.extent_bytes, **kw)


@pytest.mark.parametrize("name,size", [(n, s) for n, sizes in SWEEP.items() for s in sizes])
def test_backing_rule_matches_a_host_backend_space(name, size):
    p = sas.PLACEMENTS[name]
    want = sas.backing(size, p)
    with space_for(p, size) as space:
        before = space.stats().driver_calls()
        a = space.malloc(size)
        created = space.stats().driver_calls()["create_page"] - before["create_page"]
        rows = sorted((r for r in space.pages() if r.state == "allocated" and a in r.allocations), key=lambda r: r.address)
        if want.kind == "shared":
            assert len(rows) == 1 and created == 1, rows
            assert space.stats().mapped_bytes == p.page_bytes
        else:
            handles, last = [], None
            for r in rows:  # one row per page; consecutive rows of one handle share its page_id
                if r.page_id != last:
                    handles.append(0)
                    last = r.page_id
                handles[-1] += p.page_bytes
            assert tuple(handles) == want.handles, (handles, want)
            assert created == len(want.handles)
            assert space.stats().mapped_bytes == sum(want.handles)
            assert want.kind == ("extents" if max(want.handles) > p.page_bytes else "pages")
        space.free(a)


def test_the_sweep_covers_every_kind_and_the_documented_plans():
    assert sas.backing(300 * MiB).handles == (256 * MiB, 32 * MiB, 8 * MiB, 4 * MiB)
    assert sas.backing(1024 * MiB).handles == (256 * MiB,) * 4
    # the threshold counts the pages it covers whole: 31 MiB covers 15 (and part of a 16th)
    assert sas.backing(31 * MiB).kind == "pages" and sas.backing(32 * MiB).handles == (32 * MiB,)
    assert sas.backing(32 * MiB + 1).handles == (32 * MiB, 2 * MiB)  # the page it shares stays a page
    assert sas.backing(MiB + 1).kind == "shared" and sas.backing(2 * MiB).kind == "pages"
    assert sas.backing(100 * MiB, sas.PLACEMENTS["page32"]).handles == (32 * MiB,) * 4
    with pytest.raises(ValueError):
        sas.backing(0)


@pytest.mark.parametrize("size", [3 * MiB, 32 * MiB, 300 * MiB])
def test_mapped_evict_and_restore_costs_the_modeled_calls_per_handle(size):
    handles = len(sas.backing(size).handles)
    with AddressSpace(backend="host", capacity=size + 64 * MiB, host_capacity=size + 64 * MiB,
                      evict_mode="mapped") as space:
        a = space.malloc(size)
        space.set_evictable(a)
        for cycle in range(2):  # the first cycle also creates the host-located pages
            before = space.stats().driver_calls()
            space.offload(a)
            space.synchronize()
            space.ensure_resident(a)
            space.synchronize()
            after = space.stats().driver_calls()
        got = {k: after[k] - before[k] for k in ("map", "unmap", "set_access", "create_page", "release_page")}
        want = {k: n * handles for k, n in sas.MAPPED_CYCLE_CALLS.items()}
        assert got == {**want, "create_page": 0, "release_page": 0}
        space.free(a)


def test_cost_table_interpolates_in_log2_and_clamps():
    assert sas.call_us("map", 2 * MiB) == 2.1
    assert sas.call_us("set_access", 256 * MiB) == 32.8  # beyond the last row: the nearest
    assert sas.call_us("set_access", 64 * MiB) == pytest.approx((26.6 + 32.8) / 2)


def test_script_on_tiny_models_adds_up(tmp_path):
    out = tmp_path / "sizes.json"
    assert sas.main(["--models", "cnn,tiny_transformer", "--batches", "cnn=16,tiny_transformer=8",
                     "--budgets", "64KiB", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["predictions"] is True and len(record["results"]) == 2
    for r in record["results"]:
        s = r["summary"]
        assert s["saved_bytes"] > 0 and s["saved_storages"] > 0
        for name, pl in s["placements"].items():
            kinds = pl["by_backing"]
            assert sum(k["bytes"] for k in kinds.values()) == s["saved_bytes"], name
            assert sum(k["count"] for k in kinds.values()) == s["saved_storages"], name
            assert sum(k["share_of_bytes"] for k in kinds.values()) == pytest.approx(1.0)
            small = pl["per_budget"][str(64 * 1024)]
            assert 0 < small["evicted_bytes"] <= s["saved_bytes"] and small["handles_per_step"] > 0
            assert small["driver_calls_per_step"]["map"] == 3 * small["handles_per_step"]
            assert pl["per_budget"][str(sas.MEASURED_BUDGET)]["handles_per_step"] == 0  # all fits in 6 GiB
        assert r["prediction"] is None  # no measured rows for the smoke models


def test_pager_replay_offloads_what_paged_activations_offloads():
    """The replay of the eviction rule against the real scheduler, driven with a recording pager
    (storage bytes per pack, as DevicePager reports): the same storages are offloaded."""
    import torch

    from vtalloc.allocator.torch.activation_paging import PagedActivations

    class Recording:
        def __init__(self):
            self.offloaded = set()

        def accepts(self, t):
            return t.numel() * t.element_size() >= 1024

        def pack(self, t):
            return t, t.untyped_storage().nbytes()

        def offload(self, h):
            self.offloaded.add(h.untyped_storage()._cdata)

    tensors = [torch.empty(n, dtype=torch.uint8) for n in (4096, 8192, 100, 16384, 2048, 32768)]
    order = [0, 1, 2, 1, 3, 4, 0, 5]  # repeated storages and one under 1 KiB
    budget = 30000
    rec = Recording()
    pa = PagedActivations(rec, budget)
    with pa:
        held = [pa._pack(tensors[i]) for i in order]  # autograd would hold these
    packs = [{"storage": tensors[i].untyped_storage()._cdata, "storage_bytes": tensors[i].numel(),
              "tensor_bytes": tensors[i].numel(), "parameter": False} for i in order]
    assert sas.pager_evictions(packs, budget) == rec.offloaded and rec.offloaded
    del held


# -- ResNet-50 without torchvision -----------------------------------------------------------------

TORCHVISION, WHY_NOT = sas.torchvision_or_why()
RECORDED = BENCH / "results" / "saved_activation_sizes-2026-11-26.json"  # taken from torchvision's model


@pytest.mark.slow
def test_the_resnet50_stand_in_saves_what_torchvisions_model_saved():
    """The stand-in's saved storages at batch 512, placed and replayed, give exactly the summary the
    2026-11-26 run recorded from torchvision.models.resnet50() (storages, bytes, every placement's
    backing, handles and modeled times at the 6 GiB budget)."""
    recorded = next(r for r in json.loads(RECORDED.read_text())["results"]
                    if r["model"] == "resnet50" and r["batch"] == 512)
    packs = sas.record_saved("resnet50", 512, "stand-in")
    got = json.loads(json.dumps(sas.summarize(packs, [sas.MEASURED_BUDGET])))
    want = recorded["summary"]
    assert (got["saved_storages"], got["saved_bytes"], got["packs"]) == (282, want["saved_bytes"], want["packs"])
    for name, placement in got["placements"].items():
        assert placement["by_backing"] == want["placements"][name]["by_backing"], name
        budget = str(sas.MEASURED_BUDGET)
        assert placement["per_budget"][budget] == want["placements"][name]["per_budget"][budget], name


@pytest.mark.skipif(TORCHVISION is None, reason=f"torchvision does not import here: {WHY_NOT}")
def test_the_resnet50_stand_in_packs_the_same_storages_as_torchvision():
    stand_in, real = sas.record_saved("resnet50", 2, "stand-in"), sas.record_saved("resnet50", 2, "torchvision")
    assert [(p["storage_bytes"], p["shape"], p["dtype"], p["parameter"]) for p in stand_in] == \
           [(p["storage_bytes"], p["shape"], p["dtype"], p["parameter"]) for p in real]


@pytest.mark.skipif(TORCHVISION is not None, reason="torchvision imports here")
def test_without_torchvision_the_script_says_what_to_install_or_runs_the_stand_in():
    assert sas.resnet50_source("auto").startswith("stand-in (torchvision does not import: ")
    with pytest.raises(SystemExit, match=r"install the torchvision built for this torch"):
        sas.resnet50_source("torchvision")
