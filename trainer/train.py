"""Train one arm: `python -m trainer.train --config configs/embedded/S2.yaml [--field value ...]`.

Every field of `CapGRPOConfig` (TRL's `GRPOConfig` + ours) and TRL's `ModelConfig` can be set in the YAML
recipe or overridden on the command line (`TrlParser`).
"""

import os
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoTokenizer
from trl import ModelConfig, TrlParser, get_peft_config

from data.eval_sets import FIXED, HELDOUT, choose_eval_sets
from data.sampler import TaskSampler
from data.snapshot import load_snapshot, snapshot_sha256
from rewards.grader import GraderPool
from trainer.checkpoint import CheckpointCallback, load_resume_state
from trainer.config import CapGRPOConfig
from trainer.evaluation import EvalCallback, EvalSpec
from trainer.grpo import CapGRPOTrainer
from trainer.run_dir import StepsLog, truncate_steps, update_run_json, write_run_json


def load_base_model(path: str, dtype: str | None = None):
    """Load with the checkpoint's own class: AutoModelForCausalLM would turn Qwen3_5ForConditionalGeneration
    into a text-only model and drop the vision tower from every checkpoint we save."""
    config = AutoConfig.from_pretrained(path)
    arch = (config.architectures or ["AutoModelForCausalLM"])[0]
    torch_dtype = getattr(torch, dtype) if dtype not in (None, "auto") else "auto"
    model = getattr(transformers, arch).from_pretrained(path, dtype=torch_dtype)
    for name, p in model.named_parameters():
        if "visual" in name:  # the vision tower rides along untouched: text-only RL never updates it
            p.requires_grad_(False)
    return model, arch


def build_trainer(args: CapGRPOConfig, model_args: ModelConfig, extra_callbacks=()) -> CapGRPOTrainer:
    run_dir = Path(args.output_dir)
    if not torch.cuda.is_available():
        # The embedded model is op-overhead bound: on 2 shared cores one thread generates ~5x faster.
        torch.set_num_threads(args.cpu_threads)
    # ZeRO-3 partitions weights and optimizer state in DeepSpeed's own layout (FSDP2 is gathered instead);
    # `accelerate launch` announces DeepSpeed in this variable.
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if deepspeed and (args.eval_every > 0 or args.resume):
        raise ValueError(
            "under DeepSpeed set eval_every: 0 (evaluate checkpoints with `make eval`) and do not --resume: "
            "in-training evaluation and exact resume need 1 process, DDP or FSDP2 (docs/gpu.md)"
        )
    # A resume verifies every hash of stateNNN/ before anything else is loaded.
    resume = load_resume_state(Path(args.resume), args) if args.resume else None

    tasks_ds = load_snapshot(args.snapshot_path, expected_sha256=args.snapshot_sha256)
    tasks = {row["id"]: row for row in tasks_ds}
    eval_sets = choose_eval_sets(
        list(tasks), seed=args.eval_set_seed, heldout_size=args.heldout_size, fixed_size=args.fixed_size
    )
    model, arch = load_base_model(model_args.model_name_or_path, model_args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")

    spec = EvalSpec(
        cap=args.eval_cap or args.max_completion_length,
        temperature=args.eval_temperature if args.eval_temperature is not None else args.temperature,
        top_p=args.eval_top_p if args.eval_top_p is not None else args.top_p,
        seed=args.eval_seed,
        samples={FIXED: args.fixed_samples, HELDOUT: args.heldout_samples},
        batch_size=args.eval_batch_size,
    )
    main_process = args.process_index == 0
    if main_process:
        write_run_json(
            run_dir,
            args,
            base_model=model_args.model_name_or_path,
            architecture=arch,
            snapshot={"path": str(args.snapshot_path), "sha256": snapshot_sha256(args.snapshot_path)},
            eval_sets=eval_sets,
            eval_spec=spec.to_json(),
        )
    grader = GraderPool(
        workers=args.grader_workers, timeout_s=args.grader_timeout_s, memory_mb=args.grader_memory_mb
    )
    trainer = CapGRPOTrainer(
        model,
        args,
        tasks={t: tasks[t] for t in eval_sets.train_pool},
        sampler=TaskSampler(list(eval_sets.train_pool), seed=args.task_seed),
        grader=grader,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=list(extra_callbacks),
    )
    if main_process:  # the accelerator's view: FSDP shows only here, not in PartialState
        acc = trainer.accelerator
        update_run_json(
            run_dir,
            launch={"num_processes": acc.num_processes, "distributed_type": acc.distributed_type.value},
        )
    eval_cb = None
    if args.eval_every > 0:
        eval_cb = EvalCallback(
            run_dir,
            {FIXED: [tasks[t] for t in eval_sets.fixed], HELDOUT: [tasks[t] for t in eval_sets.heldout]},
            spec,
            eval_every=args.eval_every,
            tokenizer=tokenizer,
            grade_fn=grader.grade_batch,
            log_fn=trainer.log_eval_metrics,
        )
    # Order matters: train time is closed, then evaluation runs, then the step's row, then saving.
    trainer.add_callback(StepsLog(trainer, run_dir, eval_callback=eval_cb))
    if eval_cb is not None:
        trainer.add_callback(eval_cb)
    trainer.add_callback(CheckpointCallback(trainer, run_dir, base_dir=Path(model_args.model_name_or_path)))
    if resume is not None:
        trainer.resume_state, trainer._resume = resume[0], resume[1:]
        if main_process:
            truncate_steps(run_dir, after=trainer._resume[1]["step"])
    else:
        trainer.resume_state = None
    return trainer


def main(argv=None) -> None:
    parser = TrlParser((CapGRPOConfig, ModelConfig))
    args, model_args = parser.parse_args_and_config(argv)
    trainer = build_trainer(args, model_args)
    trainer.train(resume_from_checkpoint=str(trainer.resume_state) if trainer.resume_state else None)
    trainer.accelerator.wait_for_everyone()  # processes leave together: an early exit can abort the others'
    trainer.accelerator.end_training()  # gloo/NCCL teardown (destroys the process group)


if __name__ == "__main__":
    main()
