"""How a run's steps execute, decided once from the config and the machine (run.json `launch.backends`).

The recipe may ask (`compiled_generation`, `cpu_adamw`, `chunked_gated_delta`, `fla_causal_conv`); unset, the
machine decides: compiled rollouts on one CUDA process without vLLM (asked for on a CPU, the fixed shapes and
static cache run eagerly: transformers compiles generation on accelerators only), CPUAdamW for single-process
GPU runs, our chunked gated delta rule in GPU training passes (fla's rule and conv where fla is installed), and
in-training evaluation on the colocated vLLM engine with one process (under FSDP pushing weights is a
collective, and only the main process evaluates).
"""

from dataclasses import asdict, dataclass

from engine.chunked_gated_delta import FLA
from trainer.config import ConfigError


@dataclass(frozen=True)
class Backends:
    compiled_rollouts: bool  # rollouts generate at fixed shapes, compiled on CUDA (engine/generation.py)
    cpu_adamw: bool  # the optimizer is CPUAdamW (engine/cpu_adamw.py)
    eval_generation: str  # what in-training evaluation generates with: one of generation.BACKENDS
    chunked_gated_delta: (
        bool  # the training pass runs our chunked gated delta rule (engine/chunked_gated_delta.py)
    )
    fla_conv: bool = False  # the training pass's causal conv is fla's Triton kernel (engine/fla_conv.py)

    def to_json(self) -> dict:
        """run.json `launch.backends`."""
        return asdict(self)


def decide_backends(args, world: int, cuda: bool, fla: bool | None = None) -> Backends:
    """The backends of a run of `args` on `world` processes, with or without CUDA (and fla: default, whether it is
    installed here) on the machine."""
    fla = FLA if fla is None else fla
    if args.compiled_generation and (args.use_vllm or world > 1):
        raise ConfigError("compiled_generation: one process generating with transformers only (no vLLM)")
    gpu = cuda and not args.use_cpu  # use_cpu: the model stays on the CPU even where CUDA is present
    compiled = args.compiled_generation
    if compiled is None:
        compiled = gpu and world == 1 and not args.use_vllm
    cpu_adamw = args.cpu_adamw
    if cpu_adamw is None:  # use_cpu on a GPU host: torch's AdamW, as on a CPU machine (the H200's suite)
        cpu_adamw = gpu and world == 1
    vllm_evaluates = args.use_vllm and args.vllm_mode == "colocate" and world == 1
    evaluation = "vllm" if vllm_evaluates else "compiled" if compiled else "eager"
    chunked = args.chunked_gated_delta
    if chunked is None:  # CPU runs keep transformers' function, so their recorded rows recompute bitwise
        chunked = gpu
    chunked = chunked and not fla  # with fla installed transformers binds fla's kernels and ours steps aside
    if args.fla_causal_conv and not fla:
        raise ConfigError(
            "fla_causal_conv: true needs flash-linear-attention installed (pip install '.[fla]')"
        )
    if args.fla_causal_conv and not gpu:
        raise ConfigError("fla_causal_conv: true needs CUDA (fla's kernel is Triton's); leave it unset here")
    fla_conv = args.fla_causal_conv
    if fla_conv is None:
        fla_conv = fla and gpu
    if args.adamw_state_on_gpu and not cpu_adamw:
        raise ConfigError("adamw_state_on_gpu: true needs CPUAdamW (cpu_adamw, on by default for one GPU)")
    return Backends(compiled, cpu_adamw, evaluation, chunked, fla_conv)
