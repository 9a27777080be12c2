"""`run.json` (docs/CONTRACTS.md): written once at a run's start, then only added to (resumes, launch,
best_step); and the empty-directory check of a fresh run."""

import json
import os
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

from data.atomic import write_atomic
from rewards.outcome import grader_version
from rundir.lock import LOCK_FILE

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
    """Strict JSON only: a NaN or infinity is refused before a byte is written (`NaN` is no JSON value, and
    strict readers of run.json refuse the file)."""
    try:
        text = json.dumps(obj, indent=2, allow_nan=False)
    except ValueError as e:
        raise RunDirError(f"{path}: not written: {e}") from None
    write_atomic(path, (text + "\n").encode())


def write_run_json(
    run_dir: Path,
    args,
    *,
    arm,
    base_model: str,
    architecture: str,
    snapshot: dict,
    eval_sets,
    eval_spec,
    launch: dict,
    callbacks: list[dict],
    extra_evals: dict | None = None,
) -> dict:
    """A new run's run.json, whole, in one write: `args` are the settings the trainer runs with."""
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
        **({"extra_evals": extra_evals} if extra_evals else {}),  # the config's extra_evals, with their files
        "config": json.loads(args.to_json_string()),
        "versions": versions(),
        "code": code_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "launch": launch,
        "callbacks": callbacks,
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
    entries = [p for p in run_dir.iterdir() if p.name != LOCK_FILE] if run_dir.is_dir() else []  # ours
    held = sorted(p.name + ("/" if p.is_dir() else "") for p in entries)
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
