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
For the call, three of transformers' decode-step functions are replaced by ours, each the same function with
fewer passes over memory (`fused_decode`): the gated-delta-net recurrent update (`gated_delta_decode_step`, a
Triton kernel on CUDA), the causal conv update (`conv_decode_step`) and grouped-query attention over the
static cache (`grouped_decode_attention`). Two things of generate's loop change for the call too: the host reads
the stopping check one step late instead of waiting for the GPU every token (`deferred_stop_check`), and each
call shape keeps one static cache, reset between calls, so the captured graphs are replayed instead of
re-recorded (`kept_static_cache`; under `deterministic_kv_writes` its layers write by position,
engine/kv_writes.py); float32 products run on TF32 tensor cores (`tf32_matmuls`).
The model is the training model itself (the optimizer writes its parameters in place, and CUDA graphs read
them from the same addresses), so a rollout never comes from stale weights. Evaluation uses the same call;
which backend produced an eval file is recorded in run.json (`eval.generation`).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig
from transformers.activations import ACT2FN
from transformers.generation import utils as generation_utils
from transformers.generation.configuration_utils import CompileConfig
from transformers.generation.stopping_criteria import EosTokenCriteria
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from engine.kv_writes import use_position_writes

BACKENDS = ("eager", "compiled", "vllm")  # what produced an eval file (run.json eval.generation)
PROMPT_MULTIPLE = 64  # default prompt width bucket (rollouts: the config's prompt_multiple; evaluation: this)
DEFERRED_STOP_DEVICES = ("cuda",)  # where compiled calls read generate's stopping check a step late
# compiled calls reuse one static cache per shape (False: transformers' new one per call)
KEEP_STATIC_CACHE = True


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
    with contextlib.ExitStack() as scope:
        scope.enter_context(torch.no_grad())
        if shapes.compiled:
            scope.enter_context(fused_decode(model))
            scope.enter_context(deferred_stop_check())
            if KEEP_STATIC_CACHE:
                scope.enter_context(kept_static_cache(model))
            if model.device.type == "cuda":
                scope.enter_context(tf32_matmuls())
        generated = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return generated[: len(prompts), width:].tolist()


@contextlib.contextmanager
def tf32_matmuls() -> Iterator[None]:
    """float32 matrix products on TF32 tensor cores for the call. Compiled calls decode in the model's own
    dtype, the float32 master weights where the training pass computes in bf16 autocast, so TF32 rollouts are
    still the more precise forward of the two (SmolLM2-135M at batch 512: 14.8 -> 11.5 ms a decode step,
    docs/PERFORMANCE.md). bf16 or fp16 models do not use it. torch's per-backend setting, which `tf32: true`
    (TrainingArguments) also uses: mixing it with the legacy global one is an error in torch >= 2.9."""
    matmul = torch.backends.cuda.matmul
    precision, matmul.fp32_precision = matmul.fp32_precision, "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision = precision


_kept_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {key: (length, cache)}


def cache_key(model, cache_implementation: str, batch_size: int) -> tuple:
    """What a kept cache's tensors depend on besides the model's config and their length: the static cache
    allocates its layers lazily from the first keys and values it stores, on their device and in their dtype
    (the model's), so a cache kept from a CPU or float32 call cannot serve a CUDA or bfloat16 one."""
    return cache_implementation, batch_size, str(model.device), model.dtype


@contextlib.contextmanager
def kept_static_cache(model) -> Iterator[None]:
    """For the call, generate's static cache is the one kept for its `cache_key`, reset, where it'd be new.

    transformers (5.17-5.24) builds a new StaticCache for every generate call. Its tensors are marked static:
    the captured CUDA graphs read them at their addresses, so a cache allocated elsewhere makes torch
    re-record the decode step's graphs. Back-to-back calls tend to get the freed addresses back; calls with a
    training pass in between do not (the 1.8B benchmark: one re-recording per step, ~0.4 s). The price: the
    cache stays allocated between calls (there 256 rows x 1152 positions, 5.3 GB; the step peaked 6.3 GiB
    higher)."""
    build = model._prepare_static_cache
    kept = _kept_caches.setdefault(model, {})

    def prepare(*args, **kwargs):
        if args:  # transformers 5.17-5.24 call it by keywords; any other call gets its own cache
            return build(*args, **kwargs)
        length = max(kwargs["max_cache_len"], getattr(model, "_previous_max_cache_length", -1))
        shape = cache_key(model, kwargs["cache_implementation"], kwargs["batch_size"])
        if shape in kept and kept[shape][0] == length:
            kept[shape][1].reset()  # zeroes every layer's tensors in place
        else:  # a longer cache replaces a shorter one: transformers never asks for less again
            kept[shape] = (length, build(**kwargs))
        use_position_writes(kept[shape][1])  # under deterministic_kv_writes only (engine/kv_writes.py)
        return kept[shape][1]

    model._prepare_static_cache = prepare
    try:
        yield
    finally:
        del model._prepare_static_cache


@contextlib.contextmanager
def deferred_stop_check() -> Iterator[None]:
    """generate's stopping check read one step late on CUDA too, for the call.

    After each token generate asks the host whether every row has ended (`unfinished_sequences.max() == 0`),
    which waits for the GPU, so the GPU idles while the host prepares the next step (1.8B benchmark, batch
    256: 8.6 ms per decode step, 6.6 ms with the check deferred; docs/PERFORMANCE.md). transformers'
    `DeferredStopCheck` copies the flag asynchronously and reads it a step later (when every row ends early,
    one extra decode step runs and is undone), but transformers turns it on for mps only ("we should enable
    it for cuda if we observe perf gains"). Here its own rule for mps applies to DEFERRED_STOP_DEVICES.
    The EOS test must not wait either: `eos_stopped` stands in for EosTokenCriteria's."""
    check = getattr(generation_utils, "DeferredStopCheck", None)  # None: checked every step, as before
    original = check.__dict__["is_supported"] if check is not None else None
    eos_test = EosTokenCriteria.__call__

    def is_supported(device, *args, **kwargs):
        mps = torch.device("mps") if device.type in DEFERRED_STOP_DEVICES else device
        return original.__func__(mps, *args, **kwargs)

    EosTokenCriteria.__call__ = eos_stopped
    if check is not None:
        check.is_supported = staticmethod(is_supported)
    try:
        yield
    finally:
        EosTokenCriteria.__call__ = eos_test
        if check is not None:
            check.is_supported = original


def eos_stopped(self, input_ids, scores=None, new_token_length: int = 1, **kwargs):
    """EosTokenCriteria's test (a row stops when one of its last tokens is a stop id) as a broadcast compare.
    transformers calls `torch.isin`, which past ~10 * rows**0.145 stop ids (22 at 256 rows) sorts through
    `torch.unique`, and that waits for the GPU every token: the step benchmark's random model stops on 169
    ids (real chat models on 1 to 3)."""
    self.eos_token_id = self.eos_token_id.to(input_ids.device)
    return (input_ids[:, -new_token_length:, None] == self.eos_token_id.flatten()).any(-1).any(-1)


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

    With decay d = exp(g): S' = d S + k (x) delta, delta = beta (v - d S^T k), out = S'^T q. On CUDA one Triton
    kernel reads and writes each state tile once (engine/gated_delta_kernel.py); elsewhere, expanding S'^T q =
    d S^T q + (k . q) delta, both reads of S are one batched product S^T [k q] and the update one in-place
    pass. transformers' fallback reads the state three times and writes it twice per layer and token (at batch
    256 ~6.7 of a 12.5 ms decode step, docs/PERFORMANCE.md). Anything but one cached token goes to it."""
    state = initial_state
    if query.shape[1] != 1 or state is None or state.dtype != torch.float32 or not state.is_contiguous():
        return _reference["torch_recurrent_gated_delta_rule"](
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
    decay, beta = g[:, 0].float().exp(), beta[:, 0].float()  # [B, H]
    if _kernel is not None:  # set by fused_decode for a CUDA model's call
        out = _kernel(
            q.contiguous(), k.contiguous(), v.contiguous(), decay.contiguous(), beta.contiguous(), state
        )
        return out[:, None].to(dtype), state if output_final_state else None
    decay = decay[..., None]  # [B, H, 1]
    reads = torch.matmul(state.transpose(-1, -2), torch.stack([k, q], -1))  # [B, H, dv, 2]: S^T k, S^T q
    delta = (v - decay * reads[..., 0]) * beta[..., None]
    out = decay * reads[..., 1] + (k * q).sum(-1, keepdim=True) * delta
    state.mul_(decay[..., None]).add_(k[..., :, None] * delta[..., None, :])
    return out[:, None].to(dtype), state if output_final_state else None


def _triton_kernel():
    """The Triton decode update, or None where Triton is absent (it comes with CUDA builds of torch)."""
    try:
        from engine.gated_delta_kernel import decode_update
    except ImportError:
        return None
    return decode_update


def conv_decode_step(hidden_states, conv_state, weight, bias=None, activation=None):
    """One decode token of Qwen3.5's depthwise causal conv, the state shifted in place: the function of
    transformers' `causal_conv1d_update` fallback as one multiply-sum over the kernel window, where the
    fallback's grouped `F.conv1d` was ~0.9 ms of a 12.5 ms decode step (docs/PERFORMANCE.md)."""
    if hidden_states.shape[-1] != 1 or conv_state.shape[-1] != weight.shape[-1]:
        return _reference["causal_conv1d_update"](hidden_states, conv_state, weight, bias, activation)
    window = torch.cat([conv_state[..., 1:], hidden_states.to(conv_state.dtype)], -1)  # [B, C, K]
    conv_state.copy_(window)
    out = (window.float() * weight.float()).sum(-1, keepdim=True)  # fp32 accumulation, as conv1d's kernels
    if bias is not None:
        out = out + bias.float()[:, None]
    out = out.to(weight.dtype)
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


def grouped_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kw):
    """One decode token of grouped-query attention without copying the KV cache: the function of
    transformers' `sdpa_attention_forward`, with the query heads of each KV head as that head's queries.

    Given a mask, transformers repeats every KV head to its query heads before SDPA, a copy of the whole
    static cache per layer and token (with it the 1.8B benchmark's decode step grew from 12.2 to 15.9 ms
    between a 256- and a 1152-long cache, docs/PERFORMANCE.md); transformers >= 5.24 packs the query
    instead, but not while compiling. In float32 (no flash kernel) SDPA's memory-efficient kernel computes
    64-query tiles for the few packed queries, so there the attention is two batched products and a softmax:
    on SmolLM2-135M at batch 512 that kernel was 9.6 of a 15 ms decode step (docs/PERFORMANCE.md)."""
    groups = getattr(module, "num_key_value_groups", 1)
    mask = attention_mask  # [B, 1, 1, L] or None: shared by the heads, so it broadcasts over the packing
    if query.shape[2] != 1 or groups == 1 or dropout or (mask is not None and mask.shape[1] != 1):
        return _reference["sdpa"](
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kw
        )
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, heads // groups, groups, dim)  # query head h = kv head h // groups
    scale = dim**-0.5 if scaling is None else scaling
    if query.dtype == torch.float32:
        scores = torch.matmul(packed, key.transpose(-1, -2)) * scale  # [B, KV, groups, L]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        out = torch.matmul(scores.softmax(-1), value)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            packed, key, value, attn_mask=mask, scale=scale
        )
    return out.reshape(batch, heads, 1, -1).transpose(1, 2).contiguous(), None


_reference = {}  # transformers' functions, while ours stand in for them
_kernel = None  # the Triton update for a CUDA model's call, looked up before compiling (an import would break the graph)


@contextlib.contextmanager
def fused_decode(model) -> Iterator[None]:
    """Our decode-step functions in place of transformers' for the call: the "sdpa" attention function
    (looked up in ALL_ATTENTION_FUNCTIONS at each call) for every model, and for Qwen3.5 models the recurrent
    gated-delta update and the causal conv (the forward looks both up by module-level name at each call)."""
    global _kernel
    if _reference:  # a call inside a call: the outer one's functions are in place
        yield
        return
    module = sys.modules.get(type(model).__module__)
    names = ("torch_recurrent_gated_delta_rule", "causal_conv1d_update")
    if module is None or not all(hasattr(module, n) for n in names):
        names = ()
    _reference.update({n: getattr(module, n) for n in names}, sdpa=ALL_ATTENTION_FUNCTIONS["sdpa"])
    local = ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa")  # someone's own override, kept
    for name, fn in zip(names, (gated_delta_decode_step, conv_decode_step)):
        setattr(module, name, fn)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = grouped_decode_attention
    _kernel = (
        _triton_kernel() if names and getattr(model, "device", torch.device("cpu")).type == "cuda" else None
    )
    try:
        yield
    finally:
        for name in names:
            setattr(module, name, _reference[name])
        if local is None:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]
        else:
            ALL_ATTENTION_FUNCTIONS["sdpa"] = local
        _reference.clear()
        _kernel = None
