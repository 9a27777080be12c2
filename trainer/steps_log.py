"""The steps log: one row per optimizer step appended to results/steps.jsonl as the step's log is emitted."""

import json
from pathlib import Path

import torch
from transformers import TrainerCallback

from data.atomic import append_line
from rundir.files import steps_path

# Row fields that measure the machine, not the run: they differ between runs that are otherwise identical.
MEASURED = ("seconds", "gpu_memory")


class StepsLog(TrainerCallback):
    """Appends one row per optimizer step to results/steps.jsonl as the step's log is emitted.

    The row is the trainer's `step_record` (a StepRecord, trainer/step_record.py: selection, outcomes, timings),
    its log-prob statistics and TRL's loss/learning rate/grad norm, plus what the other two callbacks report:
    the evaluation of this step (`eval_callback.last_*`) and the save that followed the previous step
    (`checkpoint_callback.last_seconds`).
    Rows are fsynced one by one (`append_line`), so a crash loses at most the step in flight, whose torn row
    a resume drops.
    """

    def __init__(self, trainer, run_dir: Path, eval_callback=None, checkpoint_callback=None):
        self.trainer = trainer
        self.path = steps_path(run_dir)
        self.eval_callback = eval_callback
        self.checkpoint_callback = checkpoint_callback

    def on_step_begin(self, args, state, control, **kwargs):
        if on_gpu(args):
            torch.cuda.reset_peak_memory_stats()

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.record_train_seconds()  # before evaluation (the next callback) starts
        if on_gpu(args):  # after the training pass and the update: a slept engine has given its memory back
            self.trainer.step_record.update(gpu_memory=gpu_memory(args))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return  # the end-of-training summary, not a step
        trainer, arm = self.trainer, self.trainer.arm
        row = {
            "step": state.global_step,
            "arm": arm.name,
            "policy_id": arm.policy_id,
            "gate": arm.policy.gate,
            "loss": logs["loss"],
            "learning_rate": logs.get("learning_rate"),
            "grad_norm": logs.get("grad_norm"),
            **trainer.step_record.to_row(),
            **trainer.pop_logprob_stats(),
            "entropy_mean": logs.get("entropy"),
        }
        ev = self.eval_callback
        if ev is not None and ev.last_step == state.global_step:
            row["eval"] = ev.last_summary
            row["seconds"]["eval"] = ev.last_seconds
        # Saving runs after this row is written (a state never exists without its row), so a row reports
        # the save that followed the previous step.
        if (ck := self.checkpoint_callback) is not None:
            row["seconds"]["save"], ck.last_seconds = ck.last_seconds, 0.0
        row["seconds"] = {k: round(v, 4) for k, v in row["seconds"].items()}
        if state.is_world_process_zero:
            append_line(self.path, json.dumps(row))


def on_gpu(args) -> bool:
    return torch.cuda.is_available() and not args.use_cpu


def gpu_memory(args) -> dict:
    """The step's GPU memory: torch's peak allocated and reserved since the step began (vLLM's engine
    included where it allocates through torch), and what the whole device holds at the step's end, after the
    training pass, which is where sleep mode shows: a slept colocated engine holds (almost) nothing then."""
    free, total = torch.cuda.mem_get_info()
    return {
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
        "device_used_gib": round((total - free) / 2**30, 3),
        "total_gib": round(total / 2**30, 3),
        "vllm_sleep_mode": bool(
            args.use_vllm and args.vllm_mode == "colocate" and args.vllm_enable_sleep_mode
        ),
    }
