"""benchmarks/pager_models.py's checks on a few small real models: bit-identical
gradients, the space's count equal to the pager's, planned steps within 1.1x of the plan. The
CNN with batch norm always runs; the ``transformers`` models only where it imports (it is not a
test dependency: ``pip install -e '.[bench]'``)."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch")
from helpers.benchmarks import load_script  # noqa: E402

HAVE_HF = importlib.util.find_spec("transformers") is not None


@pytest.mark.parametrize("recompute", ["off", "auto"])
def test_cnn_with_batch_norm(recompute):
    row = load_script("pager_models").check("cnn", fraction=0.25, recompute=recompute, steps=3)
    assert row["ok"], row


@pytest.mark.skipif(not HAVE_HF, reason="transformers is not installed (not a test dependency)")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["gpt2", "vit"])
def test_transformers_models(name):
    row = load_script("pager_models").check(name, fraction=0.25, recompute="auto", steps=3)
    assert row["ok"], row
