"""trace_models: the models record_trace.py records allocation traces from (its model table).

Owns: ModelSpec (a transformers config class and its overrides, the model class, the task that
says what a batch holds and which loss is taken, the default batch and input size) and MODELS,
the table of them; STORED, the models whose traces are stored in benchmarks/traces/ (what
``record_trace.py --model all`` records), and EXTRA, the others (``--model extra``).
Invariants: data only, no transformers import (record_trace.build() makes the models); the
STORED specs never change, so each stored trace's recorded command still reproduces it; every
architecture is spelled out in its overrides (nothing left to a config default that a
transformers release could change) except where the default is the model's own shape.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# what a batch holds and which loss is taken (the model's own, labels passed in):
#   image-classification  pixel_values (batch, 3, size, size), a label each
#   causal-lm             input_ids (batch, size), labels = input_ids
#   masked-lm             input_ids (batch, size), labels on 15% of positions (-100 elsewhere)
#   seq2seq               input_ids (batch, size), labels (batch, size // 4)
#   speech-seq2seq        input_features (batch, mel bins, size), labels (batch, size // 16); the
#                         encoder takes exactly 2 * max_source_positions frames, so build() sets it
TASKS = ("image-classification", "causal-lm", "masked-lm", "seq2seq", "speech-seq2seq")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    about: str
    task: str  # one of TASKS
    config_class: str  # in transformers
    model_class: str
    overrides: dict[str, Any]  # passed to config_class(...): the architecture, spelled out
    batch: int
    size: int  # image side (pixels) for image classification, mel frames for speech, else the sequence length

    @property
    def vision(self) -> bool:
        return self.task == "image-classification"

    @property
    def size_name(self) -> str:
        return {"image-classification": "image", "speech-seq2seq": "mel frames"}.get(self.task, "sequence")


_VISION_HEAD = {"num_labels": 1000}
_STORED = (
    ModelSpec("resnet50", "ResNet-50", "image-classification", "ResNetConfig", "ResNetForImageClassification",
              {"embedding_size": 64, "hidden_sizes": [256, 512, 1024, 2048], "depths": [3, 4, 6, 3],
               "layer_type": "bottleneck", "hidden_act": "relu", **_VISION_HEAD}, 16, 224),
    ModelSpec("vit", "ViT-Base/16", "image-classification", "ViTConfig", "ViTForImageClassification",
              {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
               "image_size": 224, "patch_size": 16, **_VISION_HEAD}, 8, 224),
    ModelSpec("swin", "Swin-T", "image-classification", "SwinConfig", "SwinForImageClassification",
              {"image_size": 224, "patch_size": 4, "embed_dim": 96, "depths": [2, 2, 6, 2],
               "num_heads": [3, 6, 12, 24], "window_size": 7, **_VISION_HEAD}, 16, 224),
    ModelSpec("convnext", "ConvNeXt-T", "image-classification", "ConvNextConfig", "ConvNextForImageClassification",
              {"hidden_sizes": [96, 192, 384, 768], "depths": [3, 3, 9, 3], "image_size": 224, **_VISION_HEAD},
              16, 224),
    ModelSpec("llama", "a small Llama-style decoder (8 layers, hidden 1024)", "causal-lm", "LlamaConfig",
              "LlamaForCausalLM",
              {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
               "intermediate_size": 2816, "vocab_size": 32000, "max_position_embeddings": 2048,
               "tie_word_embeddings": False}, 2, 256),
    ModelSpec("t5", "T5-small (encoder-decoder; targets a quarter of the input length)", "seq2seq", "T5Config",
              "T5ForConditionalGeneration",
              {"d_model": 512, "d_ff": 2048, "d_kv": 64, "num_layers": 6, "num_decoder_layers": 6, "num_heads": 8,
               "vocab_size": 32128, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}, 8, 256),
    ModelSpec("bert", "BERT-base's layers, 6 of them; masked LM (15% of positions)", "masked-lm", "BertConfig",
              "BertForMaskedLM",
              {"hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 3072,
               "vocab_size": 30522, "max_position_embeddings": 512}, 8, 128),
    ModelSpec("gpt2", "GPT-2 small", "causal-lm", "GPT2Config", "GPT2LMHeadModel",
              {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}, 2, 256),
    ModelSpec("tiny_gpt2", "a 2-layer GPT-2 (hidden 256, vocab 8192): small enough to replay in CI",
              "causal-lm", "GPT2Config", "GPT2LMHeadModel",
              {"n_embd": 256, "n_layer": 2, "n_head": 4, "vocab_size": 8192, "n_positions": 256,
               "bos_token_id": 8191, "eos_token_id": 8191}, 4, 128),
)
_EXTRA = (
    ModelSpec("mobilenet_v2", "MobileNetV2 1.0 (inverted residuals, depthwise convs)", "image-classification",
              "MobileNetV2Config", "MobileNetV2ForImageClassification",
              {"depth_multiplier": 1.0, "image_size": 224, "hidden_act": "relu6", **_VISION_HEAD}, 32, 224),
    ModelSpec("efficientnet", "EfficientNet-B0 (MBConv, squeeze-excitation)", "image-classification",
              "EfficientNetConfig", "EfficientNetForImageClassification",
              {"width_coefficient": 1.0, "depth_coefficient": 1.0, "image_size": 224, "hidden_dim": 1280,
               "dropout_rate": 0.2, **_VISION_HEAD}, 32, 224),
    ModelSpec("deit", "DeiT-S/16 (ViT layers, hidden 384)", "image-classification", "DeiTConfig",
              "DeiTForImageClassification",
              {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
               "image_size": 224, "patch_size": 16, **_VISION_HEAD}, 16, 224),
    ModelSpec("roberta", "RoBERTa-base's layers, 6 of them; masked LM (15% of positions)", "masked-lm",
              "RobertaConfig", "RobertaForMaskedLM",
              {"hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 3072,
               "vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1,
               "layer_norm_eps": 1e-5}, 8, 128),
    ModelSpec("distilbert", "DistilBERT (6 layers, hidden 768); masked LM (15% of positions)", "masked-lm",
              "DistilBertConfig", "DistilBertForMaskedLM",
              {"dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072, "vocab_size": 30522,
               "max_position_embeddings": 512}, 8, 128),
    ModelSpec("opt", "OPT-125m (12 layers, hidden 768, learned positions)", "causal-lm", "OPTConfig",
              "OPTForCausalLM",
              {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "ffn_dim": 3072,
               "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 768}, 2, 256),
    ModelSpec("bart", "BART-base (encoder-decoder, 6 + 6 layers; targets a quarter of the input length)",
              "seq2seq", "BartConfig", "BartForConditionalGeneration",
              {"d_model": 768, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 12,
               "decoder_attention_heads": 12, "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072,
               "vocab_size": 50265, "max_position_embeddings": 1024}, 4, 256),
    ModelSpec("mistral", "a small Mistral-style decoder (8 layers, hidden 1024, 16 query / 4 key-value heads)",
              "causal-lm", "MistralConfig", "MistralForCausalLM",
              {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
               "head_dim": 64, "intermediate_size": 3584, "vocab_size": 32000, "max_position_embeddings": 2048,
               "sliding_window": 4096, "tie_word_embeddings": False}, 2, 256),
    ModelSpec("whisper", "Whisper-tiny (speech encoder-decoder, 4 + 4 layers; 80 mel bins, targets 1/16 of "
              "the frames)", "speech-seq2seq", "WhisperConfig", "WhisperForConditionalGeneration",
              {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "encoder_attention_heads": 6,
               "decoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536,
               "num_mel_bins": 80, "vocab_size": 51865, "max_target_positions": 448}, 4, 3000),
)
MODELS = {m.name: m for m in (*_STORED, *_EXTRA)}
STORED = tuple(m.name for m in _STORED)
EXTRA = tuple(m.name for m in _EXTRA)
