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
The model is the training model itself (the optimizer writes its parameters in place, and CUDA graphs read
them from the same addresses), so a rollout never comes from stale weights. Evaluation uses the same call;
which backend produced an eval file is recorded in run.json (`eval.generation`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import CompileConfig

BACKENDS = ("eager", "compiled", "vllm")  # what produced an eval file (run.json eval.generation)


@dataclass(frozen=True)
class FixedShapes:
    rows: int  # sequences per generate call
    prompt_multiple: int  # prompt widths round up to a multiple of this
    max_new_tokens: int
    fill_rows: bool = True  # False: a short call keeps its own row count (the eager evaluation's stream)

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
    if shapes.fill_rows:
        batch += [prompts[0]] * (shapes.rows - len(prompts))
    ids, mask = pad_left(batch, width, pad_id, model.device)
    with torch.no_grad():
        generated = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return generated[: len(prompts), width:].tolist()


def cut_after_eos(tokens: Sequence[int], eos: frozenset[int] | set[int]) -> list[int]:
    """TRL's completion: the tokens up to and including the first EOS."""
    for i, token in enumerate(tokens):
        if token in eos:
            return list(tokens[: i + 1])
    return list(tokens)


@contextmanager
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


def compiled_generation(args) -> bool:
    """Whether rollouts and evaluation generate at fixed shapes, compiled: by default on one CUDA process
    without vLLM (config validation refuses it with vLLM or several processes). Asked for on a CPU, the
    fixed shapes and static cache run eagerly: transformers compiles generation on accelerators only."""
    if args.compiled_generation is None:
        return torch.cuda.is_available() and args.world_size == 1 and not args.use_vllm
    return args.compiled_generation
