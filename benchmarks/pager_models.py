"""pager_models: paged_activations on small real models, checked as a user sizing a pager would.

Owns: building small models from their configs with random weights (GPT-2, Llama, BERT, T5, ViT
from ``transformers``, when it imports; a ResNet-like CNN with batch norm always), training each
a few steps without the pager and under ``paged_activations`` on a host-backend space, and the
checks per step: gradients and losses bit-identical to the run without the pager, the bytes the
space moved (its ``bytes_evicted_total + bytes_restored_total``) equal to
``PagedStats.step_bytes_paged`` and, on steps that follow a plan, at most 1.1x the plan's paged
bytes out and back; no failure. Writes one JSON row per configuration.
Invariants: seeded (the same weights and data in every run); exits 1 when a check fails.

    python benchmarks/pager_models.py --models cnn,gpt2,vit --out benchmarks/results/pager_models-cpu-DATE.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Any

MODELS = ("cnn", "gpt2", "llama", "bert", "t5", "vit")
HF = ("gpt2", "llama", "bert", "t5", "vit")


def build(torch: Any, name: str, layers: int = 2) -> tuple[Any, list[Any], Any]:
    """(model, two batches, forward returning the loss), seeded."""
    nn = torch.nn
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    b, s, v = 4, 64, 1000

    def ids(n: int = s) -> Any:
        return torch.randint(v, (b, n), generator=g)

    if name == "cnn":
        class Block(nn.Module):
            def __init__(self, c: int) -> None:
                super().__init__()
                self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
                self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

            def forward(self, x: Any) -> Any:
                return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))

        m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          *[Block(32) for _ in range(layers)], nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        batches = [(torch.randn(8, 3, 32, 32, generator=g), torch.randint(10, (8,), generator=g)) for _ in range(2)]
        return m.train(), batches, lambda m, x: nn.functional.cross_entropy(m(x[0]), x[1])
    import transformers as tf

    if name == "gpt2":
        m = tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=layers, n_embd=128, n_head=4, n_positions=128, vocab_size=v,
                                             use_cache=False, bos_token_id=0, eos_token_id=0))
    elif name == "llama":
        m = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=layers,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=v,
                                               max_position_embeddings=128, use_cache=False))
    elif name == "bert":
        m = tf.BertForMaskedLM(tf.BertConfig(hidden_size=128, num_hidden_layers=layers, num_attention_heads=4,
                                             intermediate_size=512, vocab_size=v, max_position_embeddings=128))
    elif name == "t5":
        m = tf.T5ForConditionalGeneration(tf.T5Config(d_model=128, d_ff=512, d_kv=32, num_layers=layers, num_heads=4,
                                                      vocab_size=v, decoder_start_token_id=0, pad_token_id=0))
    else:
        m = tf.ViTForImageClassification(tf.ViTConfig(hidden_size=192, num_hidden_layers=layers, num_attention_heads=3,
                                                      intermediate_size=768, image_size=64, patch_size=8, num_labels=10))
    m.config._attn_implementation = "eager"
    if name == "vit":
        batches = [(torch.randn(8, 3, 64, 64, generator=g), torch.randint(10, (8,), generator=g)) for _ in range(2)]
        return m.train(), batches, lambda m, x: m(pixel_values=x[0], labels=x[1]).loss
    batches = [(ids(), ids(s // 4 if name == "t5" else s)) for _ in range(2)]
    return m.train(), batches, lambda m, x: m(input_ids=x[0], labels=x[1]).loss


def check(name: str, *, fraction: float = 0.25, capacity: str = "64MiB", recompute: str = "auto",
          mode: str = "copy", steps: int = 4, layers: int = 2) -> dict[str, Any]:
    """Train ``name`` without and with the pager; the row of figures and checks."""
    import torch
    from vtalloc.allocator import AddressSpace
    from vtalloc.allocator.torch import paged_activations, saved_census

    torch.set_num_threads(1)
    model, batches, fwd = build(torch, name, layers)

    def train(ctx: Any, space: Any = None) -> tuple[list[Any], list[dict[str, Any]]]:
        m = copy.deepcopy(model)
        torch.manual_seed(5)
        out, per_step = [], []
        for i in range(steps):
            m.zero_grad(set_to_none=True)
            s0 = space.stats() if space is not None else None
            with ctx:
                loss = fwd(m, batches[i % 2])
            loss.backward()
            out.append([loss.detach()] + [p.grad.clone() for p in m.parameters() if p.grad is not None])
            if space is not None:
                s1, st, plan = space.stats(), ctx.stats(), ctx.plan()
                moved = (s1.bytes_evicted_total - s0.bytes_evicted_total
                         + s1.bytes_restored_total - s0.bytes_restored_total)
                per_step.append(dict(moved=moved, step_bytes_paged=st.step_bytes_paged,
                                     planned=2 * plan.summary.paged_bytes if plan is not None else None))
        return out, per_step

    reference, _ = train(__import__("contextlib").nullcontext())
    census = saved_census(lambda: fwd(copy.deepcopy(model), batches[0]))
    budget = max(int(census.bytes * fraction), 1)
    row: dict[str, Any] = dict(model=name, layers=layers, fraction=fraction, capacity=capacity, recompute=recompute,
                               mode=mode, saved_bytes=census.bytes, saved_tensors=census.count,
                               largest=census.largest, budget=budget)
    with AddressSpace(backend="host", capacity=capacity, host_capacity="1GiB", evict_mode=mode) as space:
        pager = paged_activations(space, budget=min(budget, space.capacity_bytes), recompute=recompute)
        try:
            got, per_step = train(pager, space)
        except Exception as e:  # noqa: BLE001 - a failure is a result, reported
            row.update(ok=False, error=f"{type(e).__name__}: {e}"[:500])
            return row
        finally:
            del pager
    same = all(all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(reference, got))
    counted = all(p["moved"] == p["step_bytes_paged"] for p in per_step)
    within = all(p["moved"] <= 1.1 * p["planned"] for p in per_step[1:] if p["planned"])
    row.update(steps=per_step, bit_identical=same, counted_exactly=counted, planned_steps_within_1_1x=within,
               ok=same and counted and within)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="cnn,gpt2,llama,bert,t5,vit")
    ap.add_argument("--fractions", default="0.5,0.25,0.1")
    ap.add_argument("--recompute", default="off,auto")
    ap.add_argument("--modes", default="copy,mapped")
    ap.add_argument("--capacity", default="64MiB")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = []
    for name in a.models.split(","):
        for fraction in (float(f) for f in a.fractions.split(",")):
            for rec in a.recompute.split(","):
                for mode in a.modes.split(","):
                    row = check(name, fraction=fraction, capacity=a.capacity, recompute=rec, mode=mode)
                    rows.append(row)
                    print(json.dumps({k: row[k] for k in ("model", "fraction", "recompute", "mode", "ok")}), flush=True)
    if a.out:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from lib.provenance import git_info, machine_info  # type: ignore[import-not-found]

        with open(a.out, "w") as f:
            json.dump(dict(benchmark="pager_models", machine=machine_info(), git=git_info(),
                           command=" ".join(sys.argv), rows=rows), f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
