"""The random Qwen3.5 that the benches and tests share: the embedded base's tokenizer padded to a real
vocabulary, and a seeded random-init model at any shape (layers 3 linear : 1 full, as Qwen3.5)."""

import json
import math

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast, Qwen3_5ForConditionalGeneration

from embedded.build import SPECIAL_TOKENS, BuildConfig, build_tokenizer, qwen35_config, sampling_config
from engine.chunked_gated_delta import torch_on_cpu


def padded_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """tiny_base's byte-level BPE tokenizer, its vocabulary padded with never-merged dummy tokens to `vocab`
    entries, so that the embedding and output layers have the real row count."""
    small = build_tokenizer(BuildConfig(vocab_size=min(1024, vocab), tokenizer_corpus_size=300))
    spec = json.loads(small.backend_tokenizer.to_str())
    table = spec["model"]["vocab"]
    i = 0
    while len(table) < vocab:  # ASCII letters and digits decode as themselves under the byte-level decoder
        table.setdefault(f"dummy{i}x", len(table))
        i += 1
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=small.eos_token,
        pad_token=small.pad_token,
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],  # as build_tokenizer
        chat_template=small.chat_template,
        padding_side="left",
    )


def random_qwen35(a, tokenizer, device: torch.device) -> Qwen3_5ForConditionalGeneration:
    """A seeded random-init Qwen3.5 in bf16 (fp32 on CPU), built on `device`: layers 3 linear : 1 full."""
    head_dim = 128 if a.hidden >= 512 else 16
    heads = max(2, a.hidden // head_dim)
    freqs = head_dim // 4  # rotary on half of head_dim, split over the t/h/w grids like Qwen3.5
    text = {
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(a.layers)],
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 4),
        "head_dim": head_dim,
        "linear_num_key_heads": heads,
        "linear_num_value_heads": 2 * heads,
        "linear_key_head_dim": head_dim,
        "linear_value_head_dim": head_dim,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [freqs - 2 * (freqs // 3), freqs // 3, freqs // 3],
            "mrope_interleaved": True,
        },
    }
    config = qwen35_config(tokenizer, text)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(a.seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3_5ForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(before)
    for name, p in model.named_parameters():
        if "visual" in name:
            p.requires_grad_(False)  # as load_base_model does: text-only RL never updates the vision tower
    eos = [tokenizer.eos_token_id, *stop_tokens(a, len(tokenizer))]
    model.generation_config = sampling_config(eos, tokenizer.pad_token_id)
    torch_on_cpu(model)  # as load_base_model does: with fla installed, CPU tensors take the torch reference
    return model


def stop_tokens(a, vocab: int) -> list[int]:
    """K ids from the top of the vocabulary (dummy tokens when padded). A random model samples near-uniformly,
    so each token stops a rollout with probability ~K/V: P(ended before cap) ~ 1 - exp(-cap K / V)."""
    k = round(vocab * -math.log(1 - a.p_ended) / a.cap) if a.p_ended > 0 else 0
    if k >= vocab // 2:
        raise ValueError(f"--p-ended {a.p_ended} at --cap {a.cap} needs {k} stop tokens of {vocab}")
    return list(range(vocab - k, vocab))
