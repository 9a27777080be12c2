"""Generation at compiled speed on one GPU: a static KV cache, fixed shapes and a compiled decode step.

TRL's transformers path decodes eagerly: GRPOTrainer builds its GenerationConfig with `disable_compile=True`
(trl 1.16), so `cache_implementation: static` alone gives a static cache run op by op (on the 1.8B benchmark
model at batch 256: 29.8 ms per decode step eager, 12.2 ms compiled; docs/PERFORMANCE.md). transformers compiles
the decode step (`torch.compile`, mode "reduce-overhead": CUDA graphs) when the cache is static and compile
is allowed; a graph is reused only while every input keeps its shape, so each call here has the same shape:
- `rows` sequences: a shorter call is filled with copies of its first prompt, whose outputs are dropped;
- prompt width rounded up to a multiple of `prompt_multiple` (left padding), so rounds of different prompt
  lengths share a few widths;
- one KV-cache length, `max_cache_len` (transformers sizes later caches to the largest seen).
The gated-delta-net decode update, the largest part of a compiled step, runs as `gated_delta_decode_step`
(the same function as transformers' torch fallback, fewer passes over the recurrent state).
The model is the training model itself (the optimizer writes its parameters in place, and CUDA graphs read
them from the same addresses), so a rollout never comes from stale weights. Evaluation uses the same call;
which backend produced an eval file is recorded in run.json (`eval.generation`).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import CompileConfig

BACKENDS = ("eager", "compiled", "vllm")  # what produced an eval file (run.json eval.generation)
PROMPT_MULTIPLE = 64  # default prompt width bucket (rollouts: the config's prompt_multiple; evaluation: this)


@dataclass(frozen=True)
class FixedShapes:
    rows: int  # sequences per generate call
    prompt_multiple: int  # prompt widths round up to a multiple of this
    max_new_tokens: int
    compiled: bool = True  # False: eager evaluation (own row counts, transformers' recurrent function)

    def __post_init__(self):
        if min(self.rows, self.prompt_multiple, self.max_new_tokens) < 1:
            raise ValueError(f"fixed generation shapes must be >= 1, got {self}")

    def width(self, longest: int) -> int:
        return -(-longest // self.prompt_multiple) * self.prompt_multiple


def compiled_config(config: GenerationConfig, shapes: FixedShapes, longest_prompt: int) -> GenerationConfig:
    """`config` with a static cache and the compiled decode step; `longest_prompt` sizes the first cache."""
    out = copy.deepcopy(config)
    out.cache_implementation = "static"
    out.max_cache_len = shapes.width(longest_prompt) + shapes.max_new_tokens
    out.disable_compile = False
    # dynamic=False: one graph per shape (there are few); automatic dynamic shapes would defeat CUDA graphs
    out.compile_config = CompileConfig(dynamic=False, mode="reduce-overhead")
    return out


def pad_left(
    prompts: Sequence[Sequence[int]], width: int, pad_id: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def generate_call(
    model, prompts: Sequence[Sequence[int]], config: GenerationConfig, shapes: FixedShapes, pad_id: int
) -> list[list[int]]:
    """One `model.generate` call at the fixed shapes: the tokens after each prompt (pads after an EOS
    included, as generate returns them), for the given prompts only."""
    if not 0 < len(prompts) <= shapes.rows:
        raise ValueError(f"a generate call takes 1..{shapes.rows} prompts, got {len(prompts)}")
    width = shapes.width(max(map(len, prompts)))
    batch = list(prompts)
    if shapes.compiled:
        batch += [prompts[0]] * (shapes.rows - len(prompts))
    ids, mask = pad_left(batch, width, pad_id, model.device)
    with torch.no_grad(), fused_decode(model) if shapes.compiled else contextlib.nullcontext():
        generated = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return generated[: len(prompts), width:].tolist()


def cut_after_eos(tokens: Sequence[int], eos: frozenset[int] | set[int]) -> list[int]:
    """TRL's completion: the tokens up to and including the first EOS."""
    for i, token in enumerate(tokens):
        if token in eos:
            return list(tokens[: i + 1])
    return list(tokens)


@contextlib.contextmanager
def eval_mode(model) -> Iterator[None]:
    """Eval mode and the class's own forward for the call, both restored afterwards (None: nothing to do).

    accelerate's prepare() wraps forward on the instance (autocast, every output upcast to fp32, the KV cache
    included); a checkpoint loads without it. Rollouts and evaluation run the class's forward, so both reach
    the same compiled graph (it is guarded on module modes) and a checkpoint reproduces the rows."""
    if model is None:
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    wrapped = model.__dict__.pop("forward", None)
    model.eval()
    try:
        yield
    finally:
        if wrapped is not None:
            model.forward = wrapped
        for module, training in modes:
            module.training = training


def gated_delta_decode_step(
    query,
    key,
    value,
    g,
    beta,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    **kw,
):
    """One decode token of the gated delta rule, the state updated in place: the function of transformers'
    `torch_recurrent_gated_delta_rule` (Qwen3.5's linear-attention layers) with fewer passes over the state.

    With decay d = exp(g): S' = d S + k (x) delta, delta = beta (v - d S^T k), out = S'^T q. Expanding S'^T q =
    d S^T q + (k . q) delta, both reads of S become one batched product S^T [k q], and the update is one
    in-place pass. The reference reads the state three times and writes it twice per layer and token, at
    batch 256 ~6.7 of a 12.5 ms decode step (docs/PERFORMANCE.md). Anything else goes to the reference."""
    state = initial_state
    if query.shape[1] != 1 or state is None or state.dtype != torch.float32 or not state.is_contiguous():
        return _reference_recurrent(
            query, key, value, g=g, beta=beta, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kw,
        )  # fmt: skip
    dtype = query.dtype
    if query.shape[2] != value.shape[2]:  # grouped value heads (transformers >= 5.2x leaves the repeat to us)
        query, key = (x.repeat_interleave(value.shape[2] // x.shape[2], dim=2) for x in (query, key))
    q, k, v = (x[:, 0].float() for x in (query, key, value))  # [B, H, dk] / [B, H, dv]
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q / q.shape[-1] ** 0.5
    decay = g[:, 0].float().exp()[..., None]  # [B, H, 1]
    reads = torch.matmul(state.transpose(-1, -2), torch.stack([k, q], -1))  # [B, H, dv, 2]: S^T k, S^T q
    delta = (v - decay * reads[..., 0]) * beta[:, 0].float()[..., None]
    out = decay * reads[..., 1] + (k * q).sum(-1, keepdim=True) * delta
    state.mul_(decay[..., None]).add_(k[..., :, None] * delta[..., None, :])
    return out[:, None].to(dtype), state if output_final_state else None


_reference_recurrent = None  # transformers' function, while gated_delta_decode_step stands in for it


@contextlib.contextmanager
def fused_decode(model) -> Iterator[None]:
    """`gated_delta_decode_step` in place of transformers' recurrent gated-delta function for the call, for
    Qwen3.5 models (the forward looks the function up by its module-level name at each call)."""
    global _reference_recurrent
    module = sys.modules.get(type(model).__module__)
    if module is None or not hasattr(module, "torch_recurrent_gated_delta_rule") or _reference_recurrent:
        yield
        return
    _reference_recurrent = module.torch_recurrent_gated_delta_rule
    module.torch_recurrent_gated_delta_rule = gated_delta_decode_step
    try:
        yield
    finally:
        module.torch_recurrent_gated_delta_rule, _reference_recurrent = _reference_recurrent, None


def compiled_generation(args) -> bool:
    """Whether rollouts and evaluation generate at fixed shapes, compiled: by default on one CUDA process
    without vLLM (config validation refuses it with vLLM or several processes). Asked for on a CPU, the
    fixed shapes and static cache run eagerly: transformers compiles generation on accelerators only."""
    if args.compiled_generation is None:  # use_cpu: the model stays on the CPU even where CUDA is present
        return torch.cuda.is_available() and not args.use_cpu and args.world_size == 1 and not args.use_vllm
    return args.compiled_generation
