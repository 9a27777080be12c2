"""What the trainer's micro-batch sizing (engine/micro_batch.py) picks for a model shape on a GPU of a given size,
without the GPU: the per-row estimates, the static footprint and the choice, as `size_micro_batch` computes them
on an idle device (free memory = total).

    python -m bench.micro_batch_plan                     # the shapes of docs/PERFORMANCE.md on an H200
    python -m bench.micro_batch_plan --total-gib 80     # an 80 GB card
"""

import argparse
from types import SimpleNamespace

from engine import micro_batch

QWEN35_1P8B = SimpleNamespace(  # bench/grpo_step.py's random-qwen35 at its defaults (1.82B parameters)
    hidden_size=2048, intermediate_size=6144, num_hidden_layers=12, vocab_size=248320, num_attention_heads=16,
    num_key_value_heads=4, head_dim=128, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(12)],
)  # fmt: skip
SMOLLM2_135M = SimpleNamespace(  # HuggingFaceTB/SmolLM2-135M's config.json
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, vocab_size=49152, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64,
)  # fmt: skip
# (name, shape, parameters, rollouts, longest prompt, cap, compiled rollouts)
CASES = [
    ("1.82B benchmark, cap 1024", QWEN35_1P8B, 1.82e9, 256, 128, 1024, True),
    ("1.82B benchmark, cap 8192", QWEN35_1P8B, 1.82e9, 256, 128, 8192, True),
    ("SmolLM2-135M, cap 512", SMOLLM2_135M, 0.135e9, 256, 128, 512, True),
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-gib", type=float, default=139.8, help="device memory (an H200: 139.8 GiB)")
    a = ap.parse_args(argv)
    total, dtype_bytes = a.total_gib * 2**30, 2  # bf16
    print(
        "| model | rows x tokens | MiB per row (plain / ckpt) | static GiB | budget GiB | micro-batch | AdamW state |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, shape, params, rollouts, prompt, cap, compiled in CASES:
        tokens = prompt + cap
        cache = micro_batch.kept_cache_bytes(shape, rollouts, tokens, dtype_bytes) if compiled else 0
        static = params * dtype_bytes * 2 + cache  # weights + grads; CPUAdamW's state: place_state
        static += micro_batch.head_workspace_bytes(shape, dtype_bytes)
        budget = total * (1 - micro_batch.RESERVE) - static
        rows = []
        for ckpt in (False, True):
            every, completion = micro_batch.bytes_per_token(shape, dtype_bytes, ckpt)
            rows.append((tokens * every + cap * completion) / 2**20)
        per_token = lambda c, s=shape: micro_batch.bytes_per_token(s, dtype_bytes, c)  # noqa: E731
        n, ckpt, on_gpu, _ = micro_batch.place_state(rollouts, tokens, cap, per_token, budget, 12 * params)
        print(
            f"| {name} | {rollouts} x {tokens} | {rows[0]:.0f} / {rows[1]:.0f} | {static / 2**30:.1f} | "
            f"{budget / 2**30:.1f} | {n}{', checkpointing' if ckpt else ''} | {'GPU' if on_gpu else 'host'} |"
        )


if __name__ == "__main__":
    main()
