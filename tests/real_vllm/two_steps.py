"""Two real GRPO steps of `CapGRPOTrainer` with `use_vllm: true, vllm_mode: colocate` on vLLM's CPU build.

    .venv-vllm/bin/python -m tests.real_vllm.two_steps --model DIR --out RUN_DIR --lr 1e-2

Runs `trainer.train.build_trainer` as `make train` does (snapshot, eval sets, callbacks, checkpoints), with
one substitution: training's grader is a coin on the completion text (a random-init model never answers,
and a group needs a correct and a wrong rollout to pass S2's gate), so every step trains; evaluation keeps
the real grader, as `python -m trainer.evaluation` grades. `--skip-pushes` drops every weight push after
the engine's start (what a broken sync would do). Writes
RUN_DIR/vllm_probe.json: every vLLM generate call (prompts, tokens, vLLM's log-probs, the step it ran
at), every weight push, how often transformers' generate ran, TRL's importance-sampling diagnostics per
step, and how far vLLM's weights are from the trainer's after the last step.
One run per process: a colocated engine initialises torch.distributed and vLLM's globals once.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # TRL's colocate mode: the engine in-process
# KV cache in GiB; without it the CPU backend sizes the cache as the reserved share of host memory minus this
# process's whole resident size (the trainer's included), which leaves nothing on a small machine
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import ModelConfig, TrlParser  # noqa: E402

import tests.real_vllm.kernels  # noqa: E402, F401  (weights stay pushable on an AVX-512-BF16 CPU)
from rewards.grader import BatchReport, Grade, grade_batch  # noqa: E402
from rewards.outcome import GRADER_VERSION, Outcome  # noqa: E402
from trainer import config, train  # noqa: E402
from trainer.config import CapGRPOConfig  # noqa: E402
from trainer.evaluation import EvalCallback  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SAMPLING_KEYS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
)


class CoinGrader:
    """Stands in for the grader pool: correct or wrong by a hash of the text (truncation ignored), so a
    random-init model's groups pass S2's v1 gate. Plumbing, not grading."""

    last_report = BatchReport()

    def __init__(self, **kwargs):
        pass

    def grade_batch(self, completions, references, truncated):
        def outcome(text):
            return Outcome.CORRECT if hashlib.sha256(text.encode()).digest()[0] % 2 else Outcome.WRONG

        return [Grade(outcome(t), None, GRADER_VERSION) for t in completions]


class SamplingLog(TrainerCallback):
    """TRL's per-step sampling diagnostics (they reach the Trainer's log, not steps.jsonl)."""

    def __init__(self):
        self.steps = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.steps.append({"step": state.global_step, **{k: logs.get(k) for k in SAMPLING_KEYS}})


def argv_for(model: str, out: str, lr: float) -> list[str]:
    """The embedded recipe, shrunk to two short steps; vLLM colocate as in configs/mimo9b.yaml."""
    return [
        "--config", str(REPO / "configs/embedded.yaml"),
        "--model_name_or_path", model,
        "--output_dir", out,
        "--arm", "S2",
        "--max_steps", "2",
        "--groups_per_step", "2",
        "--problems_per_round", "2",
        "--num_generations", "4",
        "--per_device_train_batch_size", "8",
        "--max_sampling_rounds", "1",
        "--max_completion_length", "12",
        "--learning_rate", str(lr),
        "--heldout_size", "4",
        "--fixed_size", "2",
        "--fixed_samples", "2",
        "--eval_every", "2",
        "--checkpoint_steps", "2",
        "--report_to", "none",
        "--disable_tqdm", "true",
        "--use_vllm", "true",
        "--vllm_mode", "colocate",
        # on the CPU backend this is the share of host memory vLLM reserves (weights + KV cache)
        "--vllm_gpu_memory_utilization", "0.05",
    ]  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--skip-pushes", action="store_true")
    a = p.parse_args(argv)

    generate_calls = []
    original_generate = transformers.GenerationMixin.generate

    def counting_generate(self, *args, **kwargs):
        generate_calls.append(1)
        return original_generate(self, *args, **kwargs)

    transformers.GenerationMixin.generate = counting_generate
    config.GraderPool = CoinGrader  # what CapGRPOConfig.grader_pool builds

    args, model_args = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(
        argv_for(a.model, a.out, a.lr)
    )
    assert args.use_vllm, "vLLM is not importable in this environment"
    sampling = SamplingLog()
    trainer = train.build_trainer(args, model_args, extra_callbacks=[sampling])
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, EvalCallback):
            callback.grade_fn = grade_batch  # the real grader (v1), as the standalone command grades
    engine = trainer.vllm_generation
    calls, pushes = [], []
    original_vllm_generate, original_sync = engine.generate, engine.sync_weights

    def recording_generate(prompts, images, num_generations, profiler=None):
        out = original_vllm_generate(prompts, images, num_generations, profiler)
        _, completions, logprobs, _ = out
        calls.append(
            {
                "step": trainer.state.global_step,
                "prompts": [list(x) for x in prompts],
                "completions": [list(x) for x in completions],
                "logprobs": [[lp[0] for lp in seq] for seq in logprobs],
            }
        )
        return out

    def recording_sync():
        pushes.append(trainer.state.global_step)
        if not a.skip_pushes:
            original_sync()

    engine.generate, engine.sync_weights = recording_generate, recording_sync
    trainer.train()

    vllm_model = engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
    ours = dict(trainer.model.named_parameters())
    name = "lm_head.weight"
    theirs = next(t for n, t in vllm_model.named_parameters() if n.endswith(name))  # vLLM nests the LM
    theirs = theirs[: ours[name].shape[0]]  # and pads the vocabulary
    probe = {
        "torch": torch.__version__,
        "vllm_calls": calls,
        "weight_pushes": pushes,
        "transformers_generate_calls": len(generate_calls),
        "sampling": sampling.steps,
        "vllm_dtype": str(theirs.dtype),
        # vLLM holds bf16: its copy equals the trainer's weights rounded to bf16
        "lm_head_max_abs_diff_bf16": (theirs.float() - ours[name].detach().to(theirs.dtype).float())
        .abs()
        .max()
        .item(),
    }
    (Path(a.out) / "vllm_probe.json").write_text(json.dumps(probe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
