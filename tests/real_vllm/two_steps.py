"""Two real GRPO steps of `CapGRPOTrainer` with `use_vllm: true, vllm_mode: colocate` on vLLM's CPU build.

    .venv-vllm/bin/python -m tests.real_vllm.two_steps --model DIR --out RUN_DIR --lr 1e-2

Runs `trainer.setup.build_trainer` as `make train` does (snapshot, eval sets, callbacks, checkpoints), with
one substitution: training's grader is a coin on the completion text (a random-init model never answers,
and a group needs a correct and a wrong rollout to pass S2's gate), so every step trains; evaluation keeps
the real grader, as `python -m trainer.eval_checkpoints` grades. `--skip-pushes` drops every weight push after
the engine's start (what a broken sync would do). `--lora` trains configs/mimo9b-lora.yaml's adapters (its
`use_peft`, `lora_*` fields and dtype) instead of the whole model, and adds the probe's "lora" entry. Writes
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
import yaml  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import ModelConfig, TrlParser  # noqa: E402

import tests.real_vllm.kernels  # noqa: E402, F401  (weights stay pushable on an AVX-512-BF16 CPU)
from rewards.grader import BatchReport, Grade, grade_batch  # noqa: E402
from rewards.outcome import GRADER_VERSION, Outcome  # noqa: E402
from trainer import setup  # noqa: E402
from trainer.config import CapGRPOConfig  # noqa: E402
from trainer.eval_callback import EvalCallback  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
LORA_RECIPE = REPO / "configs/mimo9b-lora.yaml"
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
    """The embedded recipe, shrunk to two short steps; vLLM colocate, as configs/mimo9b.yaml says to set on several GPUs."""
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


def lora_argv() -> list[str]:
    """configs/mimo9b-lora.yaml's adapter settings and dtype, as command-line flags."""
    recipe = yaml.safe_load(LORA_RECIPE.read_text())
    flags = ["--use_peft", "true", "--dtype", recipe["dtype"]]
    for key in ("lora_r", "lora_alpha", "lora_dropout"):
        flags += [f"--{key}", str(recipe[key])]
    return flags + ["--lora_target_modules", *recipe["lora_target_modules"]]


def vllm_weights(engine) -> dict[str, torch.Tensor]:
    """The engine's weights by their name from `layers.` on (vLLM nests the language model differently)."""
    model = engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
    return {n[n.index("layers.") :]: t for n, t in model.named_parameters() if "layers." in n}


class LoraWatch:
    """After every push: how many LoRA layers are left merged, and how far their base weights moved from
    the base as loaded (bitwise: 0.0 means untouched)."""

    def __init__(self, model):
        from engine.lora_push import lora_layers

        self.model, self.layers = model, lora_layers(model)
        self.base = {n: m.get_base_layer().weight.detach().clone() for n, m in self.layers.items()}
        self.after_push = []

    def check(self, step: int) -> None:
        moved = [
            (m.get_base_layer().weight - self.base[n]).abs().max().item() for n, m in self.layers.items()
        ]
        merged = sum(m.merged for m in self.layers.values())
        self.after_push.append({"step": step, "merged_layers": merged, "base_max_abs_change": max(moved)})

    def probe(self, engine, step_dir: Path) -> dict:
        """vLLM's copy of each adapted layer that vLLM keeps unfused (o_proj, out_proj, down_proj) against
        W + Δ of the trainer's adapters, against W alone, and against PEFT's merge of the saved checkpoint."""
        from peft import PeftModel
        from transformers import Qwen3_5ForConditionalGeneration

        from engine.lora_push import merged_weight

        theirs = vllm_weights(engine)
        base = Qwen3_5ForConditionalGeneration.from_pretrained(self.model.name_or_path, dtype=torch.bfloat16)
        saved = dict(
            PeftModel.from_pretrained(base, step_dir).merge_and_unload().named_parameters()
        )  # PEFT's
        compared, vs_merged, vs_base, vs_saved = [], 0.0, 0.0, 0.0
        for name, layer in self.layers.items():
            plain = name.removeprefix("base_model.model.").replace(".base_layer", "")
            key = plain[plain.index("layers.") :]
            if key not in theirs or theirs[key].shape != layer.get_base_layer().weight.shape:
                continue  # fused by vLLM (qkv_proj, gate_up_proj, in_proj_*)
            vllm_w = theirs[key].detach().float()
            ours = merged_weight(layer, layer.get_base_layer().weight.detach()).to(theirs[key].dtype).float()
            from_ckpt = saved[plain].detach().float()
            vs_merged = max(vs_merged, (vllm_w - ours).abs().max().item())
            vs_base = max(
                vs_base, (vllm_w - self.base[name].to(theirs[key].dtype).float()).abs().max().item()
            )
            vs_saved = max(vs_saved, (vllm_w - from_ckpt).abs().max().item())
            compared.append(key)
        return {
            "base": self.model.name_or_path,
            "layers": len(self.layers),
            "compared": compared,
            "vllm_vs_merged_max_abs_diff": vs_merged,
            "vllm_vs_base_max_abs_diff": vs_base,
            "vllm_vs_checkpoint_merged_max_abs_diff": vs_saved,
            "after_push": self.after_push,
            # the kinds of layer whose adapters train, and where: all in the language model?
            "trained_kinds": sorted(
                {
                    n.split(".lora_")[0].rsplit(".", 1)[1]
                    for n, p in self.model.named_parameters()
                    if p.requires_grad
                }
            ),
            "trainable_outside_lora": [
                n
                for n, p in self.model.named_parameters()
                if p.requires_grad and not ("lora_" in n and "language_model" in n)
            ],
        }


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--skip-pushes", action="store_true")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--no-conv-pack", action="store_true", help="tests/real_vllm/kernels.py's no_conv_pack")
    a = p.parse_args(argv)
    if a.no_conv_pack:
        tests.real_vllm.kernels.no_conv_pack()

    generate_calls = []
    original_generate = transformers.GenerationMixin.generate

    def counting_generate(self, *args, **kwargs):
        generate_calls.append(1)
        return original_generate(self, *args, **kwargs)

    transformers.GenerationMixin.generate = counting_generate
    setup.GraderPool = CoinGrader  # what setup.grader_pool builds

    args, model_args = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(
        argv_for(a.model, a.out, a.lr) + (lora_argv() if a.lora else [])
    )
    assert args.use_vllm, "vLLM is not importable in this environment"
    sampling = SamplingLog()
    trainer = setup.build_trainer(args, model_args, extra_callbacks=[sampling])
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, EvalCallback):
            callback.grade_fn = grade_batch  # the real grader (v1), as the standalone command grades
    engine = trainer.vllm_generation
    watch = LoraWatch(trainer.model) if a.lora else None
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
        if watch is not None:
            watch.check(trainer.state.global_step)

    engine.generate, engine.sync_weights = recording_generate, recording_sync
    trainer.train()

    vllm_model = engine.llm.llm_engine.model_executor.driver_worker.model_runner.model
    ours = {n.removeprefix("base_model.model."): p for n, p in trainer.model.named_parameters()}
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
    if watch is not None:
        probe["push_class"] = type(engine).__name__
        probe["lora"] = watch.probe(engine, Path(a.out) / "step002")
    (Path(a.out) / "vllm_probe.json").write_text(json.dumps(probe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
