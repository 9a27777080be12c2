"""The run directory's own files (docs/CONTRACTS.md): `run.json` and `results/steps.jsonl`."""

import json
import os
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

from transformers import TrainerCallback

from data.atomic import write_atomic
from rewards.outcome import grader_version

VERSIONED = ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "math-verify", "capgrpo")


def versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except Exception:  # an optional package that is not installed
            continue
    return found


def code_commit() -> dict:
    """The code a run was started from: git's HEAD (and whether the tree had changes) where the checkout has
    its .git, else CAPGRPO_COMMIT, which a copy without .git is given by whoever copied it (a lent machine)."""
    if commit := os.environ.get("CAPGRPO_COMMIT"):  # first: a copied .git can be stale (a lent machine's)
        return {"commit": commit, "dirty": None, "from": "CAPGRPO_COMMIT"}
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:
            status = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
            )
            return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()), "from": "git"}
    except OSError:  # no git on this machine
        pass
    return {"commit": None, "dirty": None, "from": None}


def write_json_atomic(path: Path, obj) -> None:
    write_atomic(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_run_json(
    run_dir: Path, args, *, base_model: str, architecture: str, snapshot: dict, eval_sets, eval_spec
) -> dict:
    arm = args.resolved_arm()
    info = {
        "arm": arm.name,
        "policy_id": arm.policy_id,
        "gate": arm.policy.gate,
        "groups_per_step": args.groups_per_step,
        "num_generations": args.num_generations,
        "grader_version": grader_version(args.grader),
        "snapshot": snapshot,
        "base_model": base_model,
        "architecture": architecture,
        "eval_sets": eval_sets.to_json(),
        "eval": eval_spec,
        "config": json.loads(args.to_json_string()),
        "versions": versions(),
        "code": code_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "run.json", info)
    return info


class RunDirError(Exception):
    """A run directory we refuse to write into or resume; the message names it and the way on."""


def refuse_non_empty(run_dir: Path) -> None:
    """A new run never writes into a directory that holds anything: it would mix or overwrite another run."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"output_dir {run_dir}: exists and is not a directory")
    held = sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir()) if run_dir.is_dir() else []
    if held:
        shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
        raise RunDirError(
            f"output_dir {run_dir} is not empty (holds {shown}): continue that run with --resume {run_dir}, "
            "or start a new one with another --output_dir"
        )


def read_run_json(run_dir: Path) -> dict:
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise RunDirError(f"{path}: missing, so {run_dir} is not a run directory that can be resumed")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}: malformed JSON ({e})") from None


def record_resume(run_dir: Path, event: dict) -> None:
    """A resume is appended to run.json's `resumes`; the run's original fields are never rewritten."""
    info = read_run_json(run_dir)
    write_json_atomic(Path(run_dir) / "run.json", {**info, "resumes": [*info.get("resumes", []), event]})


def update_run_json(run_dir: Path, **fields) -> None:
    path = run_dir / "run.json"
    write_json_atomic(path, {**json.loads(path.read_text()), **fields})


def truncate_steps(run_dir: Path, *, after: int) -> None:
    """On resume from state `after`, drop rows of steps the interrupted run did past its last state."""
    path = Path(run_dir) / "results" / "steps.jsonl"
    if path.exists():
        rows = [line for line in path.read_text().splitlines() if line.strip()]
        kept = [r for r in rows if json.loads(r)["step"] <= after]
        write_atomic(path, "".join(r + "\n" for r in kept).encode())


class StepsLog(TrainerCallback):
    """Appends one row per optimizer step to results/steps.jsonl as the step's log is emitted.

    The row is the trainer's `step_record` (selection, outcomes, timings), its log-prob statistics and TRL's
    loss/learning rate/grad norm, plus what the other two callbacks report: the evaluation of this step
    (`eval_callback.last_*`) and the save that followed the previous step (`checkpoint_callback.last_seconds`).
    Rows are flushed and fsynced one by one, so a crash loses at most the step in flight.
    """

    def __init__(self, trainer, run_dir: Path, eval_callback=None, checkpoint_callback=None):
        self.trainer = trainer
        self.path = Path(run_dir) / "results" / "steps.jsonl"
        self.eval_callback = eval_callback
        self.checkpoint_callback = checkpoint_callback

    def on_step_end(self, args, state, control, **kwargs):
        self.trainer.record_train_seconds()  # before evaluation (the next callback) starts

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
            **trainer.step_record,
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
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
                f.flush()
                os.fsync(f.fileno())
