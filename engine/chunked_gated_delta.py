"""The gated delta rule over a whole sequence, chunk by chunk: Qwen3.5's linear attention in the training pass.

Per value head, with l2-normed keys, queries scaled by dk**-0.5, a state S [dk, dv] and per-token decay
exp(g) and write strength beta, every token t does S <- exp(g_t) S + k_t (x) beta_t (v_t - exp(g_t) S^T k_t)
and reads o_t = S^T q_t. In chunks of C tokens (the Gated DeltaNet paper's chunkwise form) a chunk's C updates
collapse into matrix products: with G the within-chunk cumulative log-decay and D_ij = exp(G_i - G_j) (i >= j),
    L = I + strictly_lower(diag(beta) K K^T * D),   U = L^-1 diag(beta) V,   W = L^-1 diag(beta) exp(G) K,
    V' = U - W S,   O = exp(G) Q S + (Q K^T * D) V',   S <- exp(G_C) S + (exp(G_C - G) K)^T V'.
Only the last line is sequential over chunks.

Same arguments and results as transformers' torch fallback (`torch_chunk_gated_delta_rule`, what runs when
flash-linear-attention is absent), in float32 like it. Why ours: that fallback slices its chunk dimension with
`tensor[:, :, i]` and writes its output by slice assignment, and autograd answers each slice with a zero-filled
gradient of the whole tensor, so the backward moves ~N^2 full tensors for N chunks (18 at 1152 tokens: about
half of its 66.6 ms per layer, bench/gated_delta_rule.py). Here the chunk dimension leads and is unbound once
(its backward is one stack), the output is stacked, and L is inverted once by one triangular solve against the
identity (64 right-hand sides instead of 2 x 128) so U and W are plain products.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import sys
from collections.abc import Iterator

import torch
import torch.nn.functional as F

# what transformers' Qwen3.5 layer calls, looked up in its module by this name at each call
NAME = "torch_chunk_gated_delta_rule"
FLA = importlib.util.find_spec("fla") is not None  # fla's kernels, when installed, come first


def to_chunks(x: torch.Tensor, size: int) -> torch.Tensor:
    """[B, T, H, ...] -> [T / size, B, H, size, ...] in float32, contiguous: the chunk dimension leads."""
    b, t, h = x.shape[:3]
    x = x.reshape(b, t // size, size, h, *x.shape[3:])
    return x.permute(1, 0, 3, 2, *range(4, x.dim())).to(torch.float32, memory_format=torch.contiguous_format)


def unit_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)  # fla's l2norm, which transformers follows


def chunk_terms(q, k, v, g, beta, l2norm: bool):
    """The chunk-parallel part, on [N, B, H, C, ...] float32 chunks: U, W, the state-reading queries, the
    state-writing keys, the within-chunk scores (Q K^T * D) and each chunk's total decay. Nothing here depends
    on the chunk count, so `torch.compile(chunk_terms, dynamic=True)` serves every length with one graph."""
    chunk_size, dk = q.shape[-2], q.shape[-1]
    if l2norm:
        q, k = unit_norm(q), unit_norm(k)
    q = q * dk**-0.5
    G = g.cumsum(-1)  # [N, B, H, C]
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    D = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    eye = torch.eye(chunk_size, dtype=q.dtype, device=q.device)
    L_inv = torch.linalg.solve_triangular(
        k_beta @ k.transpose(-1, -2) * D, eye, upper=False, unitriangular=True
    )
    U = L_inv @ (v * beta[..., None])
    W = L_inv @ (k_beta * G.exp()[..., None])
    q_read = q * G.exp()[..., None]  # reads the state as it was when the chunk began
    k_write = k * (G[..., -1:] - G).exp()[..., None]  # writes it as of the chunk's end
    intra = q @ k.transpose(-1, -2) * D
    return U, W, q_read, k_write, intra, G[..., -1].exp()[..., None, None]


def chunked_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    terms=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q, k [B, T, Hk, dk], v [B, T, H, dv], g and beta [B, T, H] -> (out [B, T, H, dv] in q's dtype, the final
    state [B, H, dk, dv] or None). Key heads serve H // Hk consecutive value heads. `terms`: chunk_terms or
    a compiled form of it (bench/gated_delta_rule.py `ours-compiled-terms`)."""
    terms = terms or chunk_terms
    if kwargs.get("cu_seqlens") is not None or kwargs.get("seq_idx") is not None:
        raise ValueError(
            "chunked_gated_delta_rule: packed sequences (cu_seqlens) need flash-linear-attention"
        )
    dtype, (b, t, hk, dk), (h, dv) = query.dtype, key.shape, value.shape[-2:]
    if hk != h:
        query, key = (x.repeat_interleave(h // hk, dim=2) for x in (query, key))
    pad = -t % chunk_size  # zero keys, values and queries with beta 0 and no decay: they change nothing
    if pad:
        query, key, value = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (query, key, value))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    q, k, v, g, beta = (to_chunks(x, chunk_size) for x in (query, key, value, g, beta))
    U, W, q_read, k_write, intra, carry = terms(q, k, v, g, beta, use_qk_l2norm_in_kernel)

    if initial_state is None:
        state = q.new_zeros(b, h, dk, dv)
    else:
        state = initial_state.to(torch.float32)
    outs = []
    for u, w, qr, kw, a, c in zip(*(x.unbind(0) for x in (U, W, q_read, k_write, intra, carry))):
        v_new = u - w @ state
        outs.append(qr @ state + a @ v_new)
        state = state * c + kw.transpose(-1, -2) @ v_new
    out = torch.stack(outs, 1).transpose(2, 3).to(dtype, memory_format=torch.contiguous_format)
    out = out.reshape(b, -1, h, dv)[:, :t]
    return (out.contiguous() if pad else out), (state if output_final_state else None)


@functools.cache
def compiled_rule():
    """Ours with chunk_terms compiled once per process, dynamic in the chunk count (the loop stays eager)."""
    return functools.partial(chunked_gated_delta_rule, terms=torch.compile(chunk_terms, dynamic=True))


def modeling_module(model):
    """The transformers modeling module of the model's layers, seen through any wrapper (PEFT, accelerate)."""
    for m in model.modules():
        module = sys.modules.get(type(m).__module__)
        if hasattr(module, NAME):
            return module
    return None


@contextlib.contextmanager
def chunked_gated_delta(model, compiled_terms: bool = False) -> Iterator[None]:
    """Ours in place of transformers' torch fallback for a Qwen3.5 model's forward passes inside the block
    (`compiled_terms`: compiled_rule()). Other architectures, and runs with flash-linear-attention installed
    (its kernels come first), are untouched."""
    module = modeling_module(model)
    reference = getattr(module, NAME, None)
    ours = (chunked_gated_delta_rule, compiled_rule())
    if reference is None or FLA or reference in ours:  # the last: a block inside a block
        yield
        return
    setattr(module, NAME, ours[compiled_terms])
    try:
        yield
    finally:
        setattr(module, NAME, reference)


# What transformers' Qwen3.5 layers call by module name (5.17 and 5.2x), each of which its decorator binds to fla's
# (or causal-conv1d's) kernel when that package imports; without it each is transformers' torch reference.
KERNEL_BOUND = (NAME, "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update")


def _input_device(args, kwargs) -> str | None:
    for a in (*args, *kwargs.values()):  # a plain loop, as transformers' own check: traced by torch.compile
        if isinstance(a, torch.Tensor):
            return a.device.type
    return None


def _torch_on_cpu(bound, reference):
    """`bound` for inputs on an accelerator, transformers' torch `reference` for CPU tensors."""

    @functools.wraps(bound)
    def dispatch(*args, **kwargs):
        if _input_device(args, kwargs) == "cpu":
            return reference(*args, **kwargs)
        return bound(*args, **kwargs)

    dispatch.torch_on_cpu = True
    return dispatch


def torch_on_cpu(model) -> None:
    """With fla installed, transformers (5.17; 5.25 checks the device itself) binds fla's Triton kernels whatever
    the device of the inputs, and every forward of a Qwen3.5 model on the CPU fails in Triton. Here the model's
    modeling module answers CPU tensors with transformers' own torch reference (what its decorator wraps) and
    any other device with what transformers bound, call by call: a GPU model in the same process keeps fla's
    kernels. Without fla, or for other architectures, nothing changes. Idempotent."""
    module = modeling_module(model) if FLA else None
    for name in KERNEL_BOUND if module is not None else ():
        bound = getattr(module, name, None)
        if bound is None or getattr(bound, "torch_on_cpu", False):
            continue
        reference = inspect.unwrap(bound)
        if reference is not bound:  # the decorator's wrapper: unwrapped, transformers' torch function
            setattr(module, name, _torch_on_cpu(bound, reference))
