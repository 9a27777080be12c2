"""Training micro-batches the trainer sizes itself: rows per micro-batch and activation checkpointing.

Decided once, by the run's setup before the trainer is built (`size_micro_batch`, trainer/setup.py), for the longest rollout a step can hold: the longest
prompt of the training pool plus `max_completion_length`, so a step of capped rollouts cannot run out of
memory where a step of short ones fitted. A setting given in the recipe or on the command line wins.
- CUDA: the largest micro-batch (a divisor of the process's rollouts) whose estimated activation memory fits
  the device's memory less the weights, grads, GPU optimizer state, TRL's fused-head workspace, the kept
  generation cache and vLLM's share; without checkpointing when that micro-batch holds at least SATURATING_TOKENS tokens (or is as large
  as checkpointing would allow), else with it. CPUAdamW's fp32 state (12 bytes a parameter) goes on the GPU where
  the same micro-batch fits beside it, or a smaller one that still holds SATURATING_TOKENS (`place_state`).
- CPU: the largest micro-batch within CPU_TOKEN_BUDGET tokens, without checkpointing.
The per-token estimate (`bytes_per_token`) counts what autograd keeps for the backward, per decoder layer and in
TRL's fused LM head (which never holds the [tokens, vocabulary] logits); bench/activation_memory.py counts
the same on a real forward, and tests/test_micro_batch.py checks the estimate covers that count.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import torch
from transformers.utils import logging

from data.eval_sets import extra_evals_by_cap
from data.prompt import render_prompt
from engine.chunked_gated_delta import FLA
from engine.generation import PROMPT_MULTIPLE

logger = logging.get_logger(__name__)
CPU_TOKEN_BUDGET = 16384  # tokens per micro-batch on a CPU: memory rarely binds there, op overhead does
SATURATING_TOKENS = 8192  # a micro-batch this long keeps an H200's matmuls busy: recomputing would cost more
RESERVE = 0.1  # of device memory, left to the allocator's fragmentation, the CUDA context and generation
SAFETY = 1.2  # on the per-token estimate
# float32 values per token, value head and head dim kept by the chunked gated delta rule (Qwen3.5's linear
# attention): ~375 of a linear-attention layer's 477 KB per token with ours, 350 of 452 with transformers', at
# the 1.82B benchmark's 32 x 128 (bench/activation_memory.py [--transformers-rule], transformers 5.24); the
# layer's projections and MLP are the dense term.
GATED_DELTA_FP32 = 23
# The same with flash-linear-attention installed (transformers binds its rule; the trainer its conv): fla keeps
# bf16 inputs and a few chunk-level terms, 7.6 float32 values' worth with transformers' conv and 6.6 with fla's,
# on the H200 at the 1.82B shape (docs/performance/h200-2026-12-04e/act*.json, bench/activation_memory.py
# --device cuda [--fla-conv]); 8 covers both.
GATED_DELTA_FLA = 8
# TRL's fused LM head (trl/kernels/chunked_logprob.py): [4096 tokens, 32768 vocabulary] tiles in the model's
# dtype, and the float32 weight gradient it accumulates in the backward, once per micro-batch
HEAD_TILE = 4096 * 32768


@dataclass(frozen=True)
class MicroBatch:
    rows: int  # per_device_train_batch_size
    checkpointing: bool
    tokens_per_row: int  # the longest rollout: longest prompt + max_completion_length
    basis: str  # why: "explicit", the CPU token budget, or the CUDA memory estimate
    adamw_state_on_gpu: bool = False  # CPUAdamW's fp32 state beside the weights (absent in older run.json)

    def to_json(self) -> dict:
        """run.json `launch.micro_batch`."""
        return asdict(self)


def layer_bytes(text_config, kind: str, dtype_bytes: int) -> int:
    """Bytes one decoder layer keeps per token for its backward: ~16 hidden-size and 3 intermediate-size values
    (norms, projections, residuals, the MLP's gate, up and product), plus a linear-attention layer's float32
    intermediates of the chunked delta rule (GATED_DELTA_FP32 per value head and head dim; GATED_DELTA_FLA where
    fla's rule runs instead)."""
    hidden = text_config.hidden_size
    intermediate = getattr(text_config, "intermediate_size", None) or 4 * hidden
    dense = (16 * hidden + 3 * intermediate) * dtype_bytes
    if kind != "linear_attention":
        return dense
    heads = text_config.linear_num_value_heads
    dim = max(text_config.linear_key_head_dim, text_config.linear_value_head_dim)
    return dense + (GATED_DELTA_FLA if FLA else GATED_DELTA_FP32) * heads * dim * 4


def bytes_per_token(text_config, dtype_bytes: int, checkpointing: bool) -> tuple[float, float]:
    """(bytes every token of a row holds, bytes every completion token holds on top) during a training pass.

    With checkpointing a layer keeps only its input, while one layer at a time is recomputed in full. A
    completion token holds its hidden state in TRL's fused head, and its float32 gradient there."""
    hidden, layers = text_config.hidden_size, text_config.num_hidden_layers
    kinds = getattr(text_config, "layer_types", None) or ["full_attention"] * layers
    each = [layer_bytes(text_config, kind, dtype_bytes) for kind in kinds]
    per_token = (layers * hidden * dtype_bytes + max(each)) if checkpointing else sum(each)
    return per_token * SAFETY, hidden * (dtype_bytes + 4) * SAFETY


def head_workspace_bytes(text_config, dtype_bytes: int) -> int:
    """TRL's fused head, once per micro-batch: its projection tiles and its float32 weight gradient."""
    return HEAD_TILE * dtype_bytes + text_config.vocab_size * text_config.hidden_size * 4


def kept_cache_bytes(text_config, rows: int, length: int, dtype_bytes: int) -> int:
    """The compiled generation's kept static cache (engine/generation.py): keys and values of the full-
    attention layers, and each linear-attention layer's recurrent state (float32), for `rows` sequences."""
    layers = text_config.num_hidden_layers
    types = getattr(text_config, "layer_types", None) or ["full_attention"] * layers
    heads = text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    kv = 2 * getattr(text_config, "num_key_value_heads", heads) * head_dim * dtype_bytes * length
    value_heads = getattr(text_config, "linear_num_value_heads", 0) or 0
    state = value_heads * (getattr(text_config, "linear_key_head_dim", 0) or 0) * 4
    state *= getattr(text_config, "linear_value_head_dim", 0) or 0
    per_row = sum(kv if t == "full_attention" else state for t in types)
    return rows * per_row


def kept_caches_bytes(
    args, backends, text_config, max_prompt_tokens: int, dtype_bytes: int, eval_bytes: int | None = None
) -> int:
    """The static caches compiled generation keeps between calls (one per row count, as long as its longest
    call: prompt width rounded up to its bucket + new tokens): the rollouts', in the model's dtype, and the
    evaluation's, in its copy's (`eval_bytes`: 2 on a GPU, where evaluation decodes a bf16 copy)."""
    if not backends.compiled_rollouts:
        return 0

    def width(multiple: int) -> int:
        return -(-max_prompt_tokens // multiple) * multiple

    rows = args.generation_rows or args.problems_per_round * args.num_generations
    caches = [(rows, width(args.prompt_multiple) + args.max_completion_length, dtype_bytes)]
    if backends.eval_generation == "compiled" and args.eval_every > 0:
        extra = extra_evals_by_cap(getattr(args, "extra_evals", ()))  # the longest cap evaluated
        evaluation = width(PROMPT_MULTIPLE) + max([args.eval_cap or args.max_completion_length, *extra])
        caches.append((args.eval_batch_size, evaluation, eval_bytes or dtype_bytes))  # another model: its own
    return sum(kept_cache_bytes(text_config, n, length, b) for n, length, b in caches)


def divisors_down(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def choose(
    rollouts: int,
    row_tokens: int,
    completion_tokens: int,
    per_token,
    budget_bytes: float,
    *,
    rows: int | None = None,
    checkpointing: bool | None = None,
) -> tuple[int, bool]:
    """(rows, checkpointing) for `rollouts` rows per process within `budget_bytes` of activation memory.

    `per_token(checkpointing)` gives bytes_per_token's pair; `rows` / `checkpointing` fix what was given."""

    def fits(n: int, ckpt: bool) -> bool:
        every, completion = per_token(ckpt)
        return n * (row_tokens * every + completion_tokens * completion) <= budget_bytes

    def largest(ckpt: bool) -> int | None:
        return next((n for n in divisors_down(rollouts) if fits(n, ckpt)), None)

    if rows is not None:
        return rows, checkpointing if checkpointing is not None else not fits(rows, False)
    if checkpointing is not None:
        return largest(checkpointing) or 1, checkpointing
    plain, recomputed = largest(False), largest(True)
    if plain and (plain * row_tokens >= SATURATING_TOKENS or plain >= (recomputed or 0)):
        return plain, False
    return recomputed or 1, True


def place_state(
    rollouts: int,
    row_tokens: int,
    completion_tokens: int,
    per_token,
    budget_bytes: float,
    state_bytes: float,
    *,
    rows: int | None = None,
    checkpointing: bool | None = None,
    decide: bool = True,
) -> tuple[int, bool, bool, float]:
    """(rows, checkpointing, state on the GPU, the activations' budget) with CPUAdamW's `state_bytes`: beside the
    micro-batch when `decide` finds it fits there (the same micro-batch, or a smaller one that still holds
    SATURATING_TOKENS without checkpointing), on the GPU regardless when not deciding and `state_bytes` > 0."""

    def sized(budget: float) -> tuple[int, bool, bool]:
        n, c = choose(
            rollouts, row_tokens, completion_tokens, per_token, budget, rows=rows, checkpointing=checkpointing
        )
        every, completion = per_token(c)
        return n, c, n * (row_tokens * every + completion_tokens * completion) <= budget

    if not decide:
        return *sized(budget_bytes - state_bytes)[:2], state_bytes > 0, budget_bytes - state_bytes
    alone, beside = sized(budget_bytes), sized(budget_bytes - state_bytes)
    # a smaller micro-batch that still saturates the matmuls costs less than the host's update: at 1.82B, 16 -> 8
    # rows of 1152 tokens took the training pass from 10.5 to 11.2 s and the optimizer from 1.6 to 0.05 s
    busy = not beside[1] and beside[0] * row_tokens >= SATURATING_TOKENS
    if beside[2] and (beside[:2] == alone[:2] or busy):
        return *beside[:2], True, budget_bytes - state_bytes
    return *alone[:2], False, budget_bytes


def longest_prompt(tokenizer, problems, system: str, candidates: int = 16) -> int:
    """Tokens of the longest prompt as rendered for the model (`data.prompt.render_prompt`), tokenizing only the
    `candidates` longest problems by bytes (a real pool holds tens of thousands; a token is at least one byte,
    so the longest prompt is among them unless tokens per byte vary widely)."""
    top = sorted(problems, key=lambda p: len(p.encode()), reverse=True)[:candidates]
    rendered = (render_prompt(tokenizer, p, system) for p in top)
    return max(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in rendered)


def cuda_budget(args, model, static_bytes: int) -> float:
    """Bytes left for activations on this process's GPU: its free memory (plus what the model already holds
    there), at most its `gpu_memory_share` of the device, less RESERVE, vLLM's colocated share, and the static
    footprint."""
    free, total = torch.cuda.mem_get_info()
    held = sum(p.numel() * p.element_size() for p in model.parameters() if p.is_cuda)
    usable = min(free + held, total * args.gpu_memory_share * (1 - RESERVE))
    if args.use_vllm and args.vllm_mode == "colocate":
        usable -= total * args.vllm_gpu_memory_utilization
    return usable - static_bytes


def static_bytes(args, model, world: int, cpu_adamw: bool, cache: int) -> int:
    """Weights, grads of the trainable parameters, GPU optimizer state (two moments, none with CPUAdamW) and
    the kept generation cache; FSDP and ZeRO-3 (announced by `accelerate launch`) shard the first three."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    sharded = any(
        os.environ.get(f"ACCELERATE_USE_{k}", "false").lower() == "true" for k in ("FSDP", "DEEPSPEED")
    )
    return (weights + trainable * (1 if cpu_adamw else 3)) // (world if sharded or args.fsdp else 1) + cache


def size_micro_batch(
    args, model, max_prompt_tokens: int, backends, *, budget_bytes: float | None = None
) -> MicroBatch:
    """The micro-batch of a run of `args` (its settings, trainer/setup.py) on `backends` (see the module docstring); `budget_bytes` stands in for the device's
    activation budget (tests), which a CPU run otherwise does not have."""
    world = max(1, args.world_size)
    rollouts = args.groups_per_step * args.num_generations // world
    rows, ckpt = args.per_device_train_batch_size, args.gradient_checkpointing
    row_tokens = max_prompt_tokens + args.max_completion_length
    on_gpu = bool(args.adamw_state_on_gpu)
    if rows is not None and ckpt is not None:
        return MicroBatch(rows, ckpt, row_tokens, "explicit", on_gpu)
    text = model.config.get_text_config()
    dtype_bytes = next(model.parameters()).element_size()
    on_cuda = torch.cuda.is_available() and not args.use_cpu
    if budget_bytes is None and not on_cuda:
        fits = [n for n in divisors_down(rollouts) if n * row_tokens <= CPU_TOKEN_BUDGET] or [1]
        return MicroBatch(rows or fits[0], bool(ckpt), row_tokens, f"cpu: {CPU_TOKEN_BUDGET} tokens", on_gpu)
    if budget_bytes is None:
        cache = kept_caches_bytes(args, backends, text, max_prompt_tokens, dtype_bytes, eval_bytes=2)
        static = static_bytes(args, model, world, backends.cpu_adamw, cache)
        static += head_workspace_bytes(text, dtype_bytes)
        budget_bytes = cuda_budget(args, model, static)

    state = 12 * sum(p.numel() for p in model.parameters() if p.requires_grad)  # fp32 master, two moments
    per_token = lambda c: bytes_per_token(text, dtype_bytes, c)  # noqa: E731
    sizes = (rollouts, row_tokens, args.max_completion_length, per_token)
    decide = args.adamw_state_on_gpu is None and backends.cpu_adamw
    rows, ckpt, on_gpu, budget_bytes = place_state(
        *sizes, budget_bytes, state if decide or on_gpu else 0, rows=rows, checkpointing=ckpt, decide=decide
    )
    every, completion = per_token(ckpt)
    need = rows * (row_tokens * every + args.max_completion_length * completion)
    if need > budget_bytes:
        logger.warning(
            "per_device_train_batch_size: %d row(s) of %d tokens need ~%.1f GiB of activations by our estimate, "
            "%.1f GiB are left: a step of capped rollouts may run out of memory",
            rows, row_tokens, need / 2**30, budget_bytes / 2**30,
        )  # fmt: skip
    return MicroBatch(
        rows, ckpt, row_tokens, f"memory: {math.floor(budget_bytes / 2**30 * 10) / 10} GiB", on_gpu
    )
