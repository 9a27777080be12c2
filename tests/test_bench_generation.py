"""bench/generation.py's `--dtype` (issue 60's next levers: rollouts from a bf16 copy of the policy, and the
evaluation's bf16 decode at its long caps), on a tiny random Qwen2 on this CPU: the model is built in the dtype asked,
and the floor counts the KV cache in that dtype (a float32 model's static cache is float32)."""

import json

import pytest
import torch

from bench import generation as bench

TINY = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "vocab_size": 512, "tie_word_embeddings": True, "pad_token_id": 0, "eos_token_id": 1}  # fmt: skip


@pytest.mark.parametrize("dtype, size", [("float32", 4), ("bfloat16", 2)])
def test_the_bench_builds_its_model_in_the_dtype_asked_and_counts_the_cache_in_it(dtype, size, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    args = [
        "--config-dir",
        str(tmp_path),
        "--batch",
        "2",
        "--prompt",
        "8",
        "--new",
        "2,4",
        "--backends",
        "eager",
    ]
    result = bench.main([*args, "--dtype", dtype, "--out", str(tmp_path / "out")])
    assert result["args"]["dtype"] == dtype
    model, _ = bench.config_model(tmp_path, 0, torch.device("cpu"), getattr(torch, dtype))
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}
    # 2 layers x batch 2 x 2 KV heads x head dim 16 x (K, V) x bytes x (mean position 8 + 3 + 1)
    assert result["floor"]["bytes_parts"]["kv"] == 2 * 2 * 2 * 16 * 2 * size * 12
    # the warm-up pair, then --repeats (1) timed pair; the times themselves are the bench's figures, not asserted
    assert {n: len(s) for n, s in result["eager"]["seconds"].items()} == {2: 2, 4: 2}
