"""training_models: the seeded models and data bench_offload_training.py trains (and the probes and
predictions that reuse them), and what one plain forward saves.

Owns: ``build`` (model, input, target and loss for a model name, batch and device: ResNet-50, the
8-layer transformer, the CPU smoke models, and the ``transformers`` GPT-2 and Llama from small
configs), ``hf_model``, ``loss_fn``, ``resnet50_source`` and ``measure_forward`` (the bytes autograd
saves as the pager would take them, and the forward's FLOPs).
Invariants: seeded: the same weights and data in every process for the same arguments;
``measure_forward`` restores the RNG state, so a run that measures first trains as one that does not.
"""

from __future__ import annotations

from typing import Any

HF_MODELS = ("gpt2", "llama")  # transformers, CPU-sized, random weights
MIN_SAVED_BYTES = 1024  # paged_activations' default min_bytes: what the budget fraction counts


def build(torch: Any, model: str, batch: int, device: str) -> tuple[Any, Any, Any, Any]:
    """(model, x, y, loss_fn), seeded: the same weights and data in every process."""
    nn = torch.nn
    torch.manual_seed(0)
    seq = 1
    if model == "resnet50":
        from lib.resnet50_stand_in import resnet50_stand_in, torchvision_or_why

        tv, _ = torchvision_or_why()
        net = tv.models.resnet50() if tv is not None else resnet50_stand_in(torch)
        shape, classes = (3, 224, 224), 1000
    elif model in HF_MODELS:
        net, seq, vocab = hf_model(torch, model), 64, 1000
        g = torch.Generator().manual_seed(1)
        x = torch.randint(vocab, (batch, seq), generator=g)
        y = torch.randint(vocab, (batch, seq), generator=g)
        return net.to(device), x.to(device), y.to(device), loss_fn(torch)
    elif model == "cnn":  # smoke
        net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10))
        shape, classes = (3, 32, 32), 10
    else:
        d, heads, ff, layers, seq, classes = ((2048, 16, 8192, 8, 1024, 1000) if model == "transformer"
                                              else (64, 4, 256, 2, 32, 10))  # "tiny_transformer": smoke
        net = nn.Sequential(*[nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
                              for _ in range(layers)], nn.Linear(d, classes))
        shape = (seq, d)
    g = torch.Generator().manual_seed(1)
    x = torch.randn((batch, *shape), generator=g)
    y = torch.randint(classes, (batch, seq) if seq > 1 else (batch,), generator=g)
    net, x, y = net.to(device), x.to(device), y.to(device)
    if model in ("resnet50", "cnn"):
        net, x = net.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)

    return net, x, y, loss_fn(torch)


def resnet50_source() -> str:
    """Where ResNet-50 comes from: torchvision's model, or resnet50_stand_in.py's network (the same
    layers in the same order) where torchvision does not import. Recorded per run."""
    from lib.resnet50_stand_in import torchvision_or_why

    return "torchvision" if torchvision_or_why()[0] is not None else "resnet50_stand_in"


def loss_fn(torch: Any) -> Any:
    def loss_fn(out: Any, target: Any) -> Any:
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]).float(), target.reshape(-1))

    return loss_fn


def hf_model(torch: Any, model: str) -> Any:
    """A CPU-sized ``transformers`` causal LM from its config (random weights, seeded), whose
    forward takes token ids and returns the logits. GPT-2 keeps its default dropout (0.1)."""
    import transformers

    if model == "gpt2":
        cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=1000,
                                      use_cache=False)
        lm = transformers.GPT2LMHeadModel
    else:
        cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                       max_position_embeddings=128, use_cache=False)
        lm = transformers.LlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)

    class HFLogits(torch.nn.Module):
        """The LM as ``net(ids) -> logits`` (the loop's shape)."""

        def __init__(self, lm: Any) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids: Any) -> Any:
            return self.lm(input_ids=ids, use_cache=False).logits

    return HFLogits(lm(cfg))


def measure_forward(torch: Any, net: Any, x: Any, min_bytes: int = MIN_SAVED_BYTES) -> dict[str, int]:
    """One plain forward (RNG state restored after): the bytes autograd saves as the pager would
    take them (not parameters, not under ``min_bytes``, a tensor saved twice counted once) and
    its FLOPs by ``FlopCounterMode`` (matmuls and convolutions; elementwise operations count 0)."""
    from torch.utils.flop_counter import FlopCounterMode

    seen: set[tuple[int, int]] = set()
    keep: list[Any] = []
    saved = {"bytes": 0, "tensors": 0}

    def pack(t: Any) -> Any:
        base = t._base if t._base is not None else t
        nbytes = t.numel() * t.element_size()
        if not (base.is_leaf and base.requires_grad) and nbytes >= min_bytes and (id(t), t._version) not in seen:
            seen.add((id(t), t._version))
            keep.append(t)
            saved["bytes"] += nbytes
            saved["tensors"] += 1
        return t

    with torch.random.fork_rng(devices=[]), FlopCounterMode(display=False) as fc, \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = net(x)
    del out
    keep.clear()
    return {"saved_bytes": saved["bytes"], "saved_tensors": saved["tensors"], "forward_flops": int(fc.get_total_flops())}
