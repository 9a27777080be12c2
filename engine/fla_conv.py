"""Qwen3.5's depthwise causal conv in the training forward through flash-linear-attention's Triton kernel.

Why: with fla installed transformers binds fla's gated delta rule by itself, but it takes the conv from Dao's
`causal_conv1d` package (CUDA source only; not on the lent image), so the conv runs as its torch fallback: a
grouped F.conv1d on [B, C, T], fed by a contiguous copy of the projection's transpose. That is ~6 % of the 1.82B
training pass's device time, the copies aside (docs/PERFORMANCE.md, third lease of 2026-12-04). fla's
`causal_conv1d` (forward and backward in Triton) reads the projection's [B, T, C] layout as it is: the transposes
below are views. The trainer's training forward runs it where fla is installed (`fla_causal_conv`, run.json
`launch.backends.fla_conv`): the 1.82B pass 5.43 instead of 6.67 s on the H200 (`bench/training_pass.py --fla-conv`;
docs/PERFORMANCE.md, fifth lease of 2026-12-04).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from engine.chunked_gated_delta import FLA, modeling_module

NAME = "causal_conv1d_fn"  # what transformers' Qwen3.5 layer calls (5.17 and 5.2x), looked up at each call


def fla_causal_conv(hidden_states, weight, bias=None, activation=None, **kwargs) -> torch.Tensor:
    """transformers' `causal_conv1d_fn` contract (x [B, C, T], weight [C, W] -> [B, C, T] in x's dtype) on fla's
    kernel, whose contract is [B, T, C] in and out."""
    from fla.modules.causal_conv1d import causal_conv1d

    out, _ = causal_conv1d(hidden_states.transpose(1, 2), weight, bias, activation=activation)
    return out.transpose(1, 2).to(hidden_states.dtype)


@contextlib.contextmanager
def fla_conv(model, on: bool = True) -> Iterator[None]:
    """Inside the block the model's Qwen3.5 layers run fla's conv, transformers' function again after. Other
    architectures, and runs without fla, are untouched. fla's kernel is Triton's: CUDA tensors only."""
    module = modeling_module(model)
    if not (on and FLA and hasattr(module, NAME)):
        yield
        return
    reference = getattr(module, NAME)
    setattr(module, NAME, fla_causal_conv)
    try:
        yield
    finally:
        setattr(module, NAME, reference)
