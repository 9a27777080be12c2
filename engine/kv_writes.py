"""The static KV cache's writes under `deterministic: true`, as one plain copy kernel each.

transformers' StaticLayer writes a token's keys and values with `index_copy_` (5.14-5.25). Under
`torch.use_deterministic_algorithms(True)` Inductor lowers that write to a fallback, torch's deterministic
`index_put_` (a radix sort of the positions and several kernels; torch/_inductor/lowering.py "Fallback in
torch deterministic mode"), twice per attention layer and token of the compiled decode step, where without
the flag it fuses the write into the kernel that computes the keys. Its deterministic path exists for
repeated positions, where two writes race. A cache's positions never repeat, so the plain kernel is
deterministic here by construction, and the values written are the same bits.

With `deterministic_kv_writes: true` (the default; trainer/setup.py apply_determinism sets POSITION_WRITES), the
compiled calls' cache layers write through `write_positions`, an opaque custom op that Inductor calls in place on
the cache, without the sort. tests/test_kv_writes.py shows the fallback and its removal on the CPU. On the H200 the
1.5B's decode step took 7.68 ms under the flag, 6.10 with position writes and 5.97 without the flag, with the same
tokens (`python -m bench.generation --deterministic --kv-writes true|false`; docs/PERFORMANCE.md).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import StaticLayer

POSITION_WRITES = False  # set once per process, beside torch's own deterministic switches


@torch.library.custom_op(
    "capgrpo::write_positions",
    mutates_args=("cache",),
    schema="(Tensor(a!) cache, Tensor positions, Tensor states) -> ()",
)
def write_positions(cache: torch.Tensor, positions: torch.Tensor, states: torch.Tensor) -> None:
    """cache[:, :, positions] = states, positions distinct: torch's plain index_copy_ kernel, which is
    deterministic when no two positions are equal (the switch is host state, read when the kernel launches;
    a captured CUDA graph replays the kernel itself)."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        cache.index_copy_(2, positions, states)
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


@write_positions.register_fake
def _(cache, positions, states) -> None:
    return None


class PositionWriteLayer(StaticLayer):
    """StaticLayer whose update writes through `write_positions`: the same positions (the layer's running
    length onward) and the same tensors returned as transformers' update; tests/test_kv_writes.py compares
    the two on the installed transformers."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = key_states.shape[-2]
        positions = torch.arange(length, device=self.device) + self.cumulative_length
        self.cumulative_length.add_(length)  # in place: its address is static to the compiled step
        write_positions(self.keys, positions, key_states)
        write_positions(self.values, positions, value_states)
        return self.keys, self.values


def use_position_writes(cache) -> None:
    """The cache's plain static layers write by position from now on, where POSITION_WRITES and torch's
    deterministic algorithms are both on (without the flag Inductor fuses transformers' own write)."""
    if not (POSITION_WRITES and torch.are_deterministic_algorithms_enabled()):
        return
    for layer in getattr(cache, "layers", ()):
        if type(layer) is StaticLayer:
            layer.__class__ = PositionWriteLayer  # a subclass without state of its own: the tensors stay put
