"""`vtalloc demo`'s training part: CPU tensors over a host space here, the torch allocator on a GPU."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from vtalloc.allocator import BackendUnavailableError, InvalidArgumentError
from vtalloc.client.cli import app
from vtalloc.client.train_demo import run_train_demo


def test_host_training_is_identical_to_plain_cpu_and_reports_pages():
    r = run_train_demo(backend="host", steps=3, capacity="64MiB")
    assert r.device == "cpu" and r.steps == 3 and len(r.losses) == 3
    assert r.identical_to_reference
    assert r.losses[-1] < r.losses[0]
    assert r.saved_activation_bytes > 0
    s = r.stats
    assert s["pages_mapped"] > 0 and s["mapped_bytes"] == s["pages_mapped"] * 2 * (1 << 20)
    assert s["num_allocs"] > 6  # six parameters, the input, and the activations of every step
    assert s["num_frees"] > 0  # saved activations went back after each backward


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"steps": True}, {"steps": 2.0}, {"backend": "tpu"}])
def test_bad_arguments(kwargs):
    with pytest.raises(InvalidArgumentError):
        run_train_demo(**{"backend": "host", "steps": 2, **kwargs})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")
def test_cuda_training_without_a_gpu_is_backend_unavailable():
    with pytest.raises(BackendUnavailableError, match="cannot train on a GPU"):
        run_train_demo(backend="cuda", steps=1)


def test_cli_demo_trains_and_reports_json():
    res = CliRunner().invoke(app, ["demo", "--backend", "host", "--steps", "2", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "vtalloc.demo/v1"
    assert doc["defrag"]["survivors_intact"]
    assert doc["train"]["identical_to_reference"] and doc["train"]["steps"] == 2
    assert doc["train"]["stats"]["pages_mapped"] > 0


def test_cli_demo_text_and_no_train():
    res = CliRunner().invoke(app, ["demo", "--backend", "host", "--steps", "2"])
    assert res.exit_code == 0, res.output
    assert "training with vtalloc's memory" in res.stdout and "pages_mapped" in res.stdout
    res = CliRunner().invoke(app, ["demo", "--backend", "host", "--no-train", "--json"])
    assert res.exit_code == 0, res.output
    assert "train" not in json.loads(res.stdout)


@pytest.mark.gpu
def test_gpu_training_under_vtalloc_matches_native():
    r = run_train_demo(backend="cuda", steps=3)
    assert r.device == "cuda" and r.identical_to_reference
    assert r.stats["num_allocs"] > 0
