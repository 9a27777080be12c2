"""The training forward's RMSNorms, gated RMSNorms and MLPs under torch.compile (`compile_norms_mlp: true`, off by
default until a whole-step measurement backs it; docs/gpu.md).

Why: at the 1.82B shape the training pass spends about 40 % of its device time in copies and elementwise kernels
(docs/PERFORMANCE.md, third lease of 2026-12-04): the float32 RMSNorms, the gated norm, silu(gate) x up, each a
chain of full-size kernels with float32 intermediates that one fused kernel (forward and backward) replaces.
Compiled per module class, dynamic in the token count (a step's rows change length), so every layer of a class
shares one graph. Scoped to the training forward, like our chunked rule: generation compiles its own graphs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

PARTS = ("RMSNorm", "RMSNormGated", "MLP")  # class-name endings of the text layers' parts


def parts(model) -> list[torch.nn.Module]:
    """The text model's norms and MLPs (a vision tower's are left alone: text-only RL never runs it)."""
    return [
        m for m in model.modules() if type(m).__name__.endswith(PARTS) and "Vision" not in type(m).__name__
    ]


@functools.cache
def compiled_class_forward(cls: type):
    """The class's forward compiled once: its modules are an argument, so all layers share the graphs."""
    return torch.compile(cls.forward, dynamic=True)


@contextlib.contextmanager
def compiled_parts(model, on: bool = True) -> Iterator[None]:
    """Inside the block the model's norms and MLPs run compiled; their own forwards again after."""
    modules = parts(model) if on else []
    for m in modules:
        m.forward = functools.partial(compiled_class_forward(type(m)), m)  # shadows the class's forward
    try:
        yield
    finally:
        for m in modules:
            del m.forward
