"""What a training pass keeps for its backward, by layer type, against engine/micro_batch.py's estimate.

    python -m bench.activation_memory                      # the 1.82B benchmark's layers, 1 row x 1152 tokens
    python -m bench.activation_memory --config-dir artifacts/smollm2 --prompt 128 --completion 512
    python -m bench.activation_memory --device cuda --fla-conv     # with fla installed: fla's rule and conv

Counts the bytes of every tensor autograd saves during one forward (TRL's fused LM head included, as
GRPOTrainer calls it), once per storage, split at each decoder layer and the head. The layers' sizes do not
depend on their number, so the 1.82B model is built with one group of 3 linear + 1 full-attention layers and
the real hidden, intermediate and vocabulary sizes; on a CPU, in bf16, so it runs here. What it cannot see:
transient buffers of the backward (TRL's head accumulates its weight gradient in float32, [V, H]) and the CUDA
attention kernel's own saves, which differ from the CPU's. With flash-linear-attention installed (CUDA only)
transformers binds fla's rule and ours steps aside, so the linear-attention layer counts fla's saves.
"""

import argparse
import contextlib
import json
from pathlib import Path

import torch
from trl.trainer.utils import add_fused_lm_head

from bench.generation import config_model
from bench.models import padded_tokenizer, random_qwen35
from engine.chunked_gated_delta import FLA, chunked_gated_delta
from engine.fla_conv import fla_conv
from engine.micro_batch import SAFETY, bytes_per_token


class SavedBytes:
    """Bytes of the distinct storages autograd saves, attributed to whichever module is running."""

    def __init__(self, model):
        self.by_part, self.part = {}, "embedding"
        self.seen = {
            p.untyped_storage().data_ptr() for p in model.parameters()
        }  # weights are not activations

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.seen and t.device.type != "meta":
            self.seen.add(storage.data_ptr())
            self.by_part[self.part] = self.by_part.get(self.part, 0) + storage.nbytes()
        return t


def measure(model, rows: int, prompt: int, completion: int, ours: bool = True, conv: bool = False) -> dict:
    """`ours`: the linear attention's chunked rule as the trainer's pass runs it (engine/chunked_gated_delta.py);
    False: transformers' torch fallback, what plain TRL runs (fla's, either way, where fla is installed).
    `conv`: fla's causal conv (engine/fla_conv.py)."""
    text = model.config.get_text_config()
    counter = SavedBytes(model)
    backbone = getattr(model.model, "language_model", model.model)  # Qwen3.5 nests its text model
    layers = backbone.layers
    types = getattr(text, "layer_types", None) or ["full_attention"] * len(layers)
    for layer, kind in zip(layers, types, strict=True):
        layer.register_forward_pre_hook(lambda m, a, kind=kind: setattr(counter, "part", kind))
    backbone.norm.register_forward_hook(lambda m, a, o: setattr(counter, "part", "head"))
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(0, text.vocab_size, (rows, prompt + completion), device=model.device)
    labels = ids.clone()
    labels[:, :prompt] = -100
    model.train()
    rule = chunked_gated_delta(model) if ours else contextlib.nullcontext()
    with rule, fla_conv(model, conv), torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
    del out
    tokens = rows * (prompt + completion)
    per_layer = {
        kind: counter.by_part.get(kind, 0) / types.count(kind) / tokens for kind in sorted(set(types))
    }
    saved = (
        sum(per_layer[k] * types.count(k) for k in per_layer) + counter.by_part.get("embedding", 0) / tokens
    )
    every, per_completion = bytes_per_token(
        text, next(model.parameters()).element_size(), checkpointing=False
    )
    return {
        "rule": "fla" if FLA else "ours" if ours else "transformers",
        "fla_conv": conv,
        "layers": {k: types.count(k) for k in sorted(set(types))},
        "saved_bytes_per_token_per_layer": per_layer,
        "saved_bytes_per_token_head": counter.by_part.get("head", 0) / (rows * completion),
        "saved_bytes_per_token_layers": saved,
        "estimate_bytes_per_token_layers": every / SAFETY,
        "estimate_bytes_per_completion_token_head": per_completion / SAFETY,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--config-dir", type=Path, help="a model of this config.json instead of the 1.82B's layers"
    )
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--completion", type=int, default=1024)
    ap.add_argument(
        "--transformers-rule", action="store_true", help="transformers' gated delta rule, not ours"
    )
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (fla's kernels run there only)")
    ap.add_argument("--fla-conv", action="store_true", help="fla's causal conv (engine/fla_conv.py; CUDA)")
    ap.add_argument("--out", type=Path, default=None, help="writes activation_memory.json here")
    a = ap.parse_args(argv)
    torch.set_num_threads(2)
    device = torch.device(a.device)
    if a.config_dir:
        model = config_model(a.config_dir, 0, torch.device("cpu"))[0].to(torch.bfloat16)
    else:
        a.p_ended, a.cap, a.seed = 0, a.completion, 0
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # random_qwen35 builds fp32 off CUDA
        try:
            model = random_qwen35(a, padded_tokenizer(a.vocab), torch.device("cpu")).to(torch.bfloat16)
        finally:
            torch.set_default_dtype(before)
    model = model.to(device)
    result = measure(model, a.rows, a.prompt, a.completion, ours=not a.transformers_rule, conv=a.fla_conv)
    print(json.dumps(result, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "activation_memory.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
