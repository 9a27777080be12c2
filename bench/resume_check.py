"""Resume check on any device: an uninterrupted run vs. one killed (SIGKILL) after stateK/ and resumed.

    python bench/resume_check.py --kill-after 1 -- --config configs/embedded/S2.yaml --max_steps 3 ...

Everything after `--` goes to `python -m trainer.train`. Prints, per step, whether the task-sampler position,
the trained task ids, the outcome counts and the eval seeds agree, and the largest weight difference of the
last checkpoint. On CPU all of it is bitwise (tests/test_train_e2e.py asserts that); on GPU the kernels are
not deterministic, so outcomes and weights may drift while the sampler position and seeds must still agree.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file


def train(args: list[str], out: Path, kill_after: int | None = None, resume: bool = False) -> None:
    cmd = [sys.executable, "-m", "trainer.train", *args, "--output_dir", str(out)]
    cmd += ["--resume", str(out)] if resume else []
    proc = subprocess.Popen(cmd, start_new_session=True)
    while proc.poll() is None:
        if kill_after is not None and (out / f"state{kill_after:03d}").is_dir():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with {proc.returncode}")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill-after", type=int, default=1)
    ap.add_argument("--out", default="runs/resume_check")
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = [x for x in a.train_args if x != "--"]
    ref, out = Path(a.out) / "uninterrupted", Path(a.out) / "resumed"
    train(args, ref)
    train(args, out, kill_after=a.kill_after)
    train(args, out, resume=True)

    report = []
    for r, o in zip(rows(ref / "results/steps.jsonl"), rows(out / "results/steps.jsonl"), strict=True):
        report.append(
            {
                "step": r["step"],
                "sampler": r["sampler"] == o["sampler"],
                "tasks": r["task_ids_trained"] == o["task_ids_trained"],
                "outcomes": r["outcomes_sampled"] == o["outcomes_sampled"],
                "loss_diff": abs(r["loss"] - o["loss"]),
            }
        )
    evals = sorted(p.name for p in (ref / "results").glob("eval_step*.jsonl"))
    seeds = all(
        [(x["task_id"], x["sample"], x["seed"]) for x in rows(ref / "results" / n)]
        == [(x["task_id"], x["sample"], x["seed"]) for x in rows(out / "results" / n)]
        for n in evals
    )
    last = max(p.name for p in ref.glob("step[0-9][0-9][0-9]"))
    wa, wb = load_file(ref / last / "model.safetensors"), load_file(out / last / "model.safetensors")
    max_diff = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    print("| step | sampler position | trained task ids | sampled outcomes | |loss diff| |")
    print("|---|---|---|---|---|")
    for x in report:
        print(f"| {x['step']} | {x['sampler']} | {x['tasks']} | {x['outcomes']} | {x['loss_diff']:.3g} |")
    print(f"eval seeds identical in {len(evals)} files: {seeds}; max |weight diff| in {last}: {max_diff:.3g}")


if __name__ == "__main__":
    main()
