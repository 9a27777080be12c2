"""Resume check on any device: an uninterrupted run vs. one killed (SIGKILL) after stateK/ and resumed; with
--twice, two uninterrupted runs of the same command (the determinism check of `--deterministic true`, issue 47).

    python -m bench.resume_check --kill-after 1 -- --config configs/embedded.yaml --max_steps 3 ...
    python -m bench.resume_check --accelerate-config configs/accelerate/fsdp2.yaml --processes 2 -- ...
    python -m bench.resume_check --twice --report twice.json -- --config configs/smollm2.yaml --deterministic true ...
    python -m bench.resume_check --compare RUN_A RUN_B --report found.json     # two runs that already ran

Everything after `--` goes to `python -m trainer.train`. Prints, per step, whether the task-sampler position,
the trained task ids, the outcome counts and the eval seeds agree, and the largest weight difference of the
last checkpoint. On CPU all of it is bitwise (tests/test_train_e2e.py asserts that); on GPU the kernels are
not deterministic, so outcomes and weights may drift while the sampler position and seeds must still agree.
"""

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from rundir import archive
from rundir.files import read_jsonl
from trainer.steps_log import MEASURED

# timings, and the grader pool's bookkeeping (worker recycling follows the workers' memory, not the run)
UNCOMPARED = (*MEASURED, "grader")


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def train(launch: list[str], args: list[str], out: Path, kill_after: int | None = None, resume=False) -> None:
    cmd = [*launch, "-m", "trainer.train", *args, "--output_dir", str(out)]
    cmd += ["--resume", str(out)] if resume else []
    proc = subprocess.Popen(cmd, start_new_session=True)
    while proc.poll() is None:
        if kill_after is not None and (out / f"state{kill_after:03d}").is_dir():
            for pid in [
                proc.pid,
                *descendants(proc.pid),
            ]:  # torch's launcher puts workers in their own sessions
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with {proc.returncode}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill-after", type=int, default=1)
    ap.add_argument("--twice", action="store_true", help="two uninterrupted runs, no kill (determinism)")
    ap.add_argument("--out", default="runs/resume_check")
    ap.add_argument("--accelerate-config", default=None, help="`accelerate launch` with this config")
    ap.add_argument("--processes", type=int, default=1, help=">1: `accelerate launch --num_processes N`")
    ap.add_argument("--report", type=Path, default=None, help="also write the findings here as JSON")
    ap.add_argument(
        "--compare", nargs=2, type=Path, metavar=("REF", "OUT"), help="only compare two run folders"
    )
    ap.add_argument("train_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if a.compare:
        compare(*a.compare, a.report)
        return
    args = [x for x in a.train_args if x != "--"]
    launch = [sys.executable]
    if a.accelerate_config or a.processes > 1:  # without a config: --multi_gpu (gloo processes on a CPU)
        config = ["--config_file", a.accelerate_config] if a.accelerate_config else ["--multi_gpu"]
        launch += ["-m", "accelerate.commands.launch", *config, "--num_processes", str(a.processes)]
    ref, out = (Path(a.out) / n for n in (("first", "second") if a.twice else ("uninterrupted", "resumed")))
    if Path(a.out).is_dir() and any(Path(a.out).iterdir()):  # a check never overwrites an earlier one
        raise SystemExit(f"error: {a.out} is not empty: pass another --out, or remove it")
    train(launch, args, ref)
    if a.twice:
        train(launch, args, out)
    else:
        train(launch, args, out, kill_after=a.kill_after)
        train(launch, args, out, resume=True)

    compare(ref, out, a.report)


def compare(ref: Path, out: Path, report_path: Path | None) -> dict:
    """Step rows, eval rows and the last checkpoint's weights of two runs (weights: None when neither run kept
    a stepNNN/; runs copied off a lent machine often keep rows only)."""
    steps = [read_jsonl(d / "results/steps.jsonl") for d in (ref, out)]
    report = [
        {
            "step": r["step"],
            "sampler": r["sampler"] == o["sampler"],
            "tasks": r["task_ids_trained"] == o["task_ids_trained"],
            "outcomes": r["outcomes_sampled"] == o["outcomes_sampled"],
            "loss_diff": abs(r["loss"] - o["loss"]),
        }
        for r, o in zip(*steps, strict=True)
    ]
    names = [p.name for p in archive.listing(ref / "results", "eval_step*.jsonl")]  # published runs: packed
    evals = [(read_jsonl(ref / "results" / n), read_jsonl(out / "results" / n)) for n in names]
    seeds = all(
        [(x["task_id"], x["sample"], x["seed"]) for x in e]
        == [(x["task_id"], x["sample"], x["seed"]) for x in f]
        for e, f in evals
    )
    last = max((p.name for p in ref.glob("step[0-9][0-9][0-9]")), default=None)
    max_diff = None
    if last is not None:
        wa, wb = load_file(ref / last / "model.safetensors"), load_file(out / last / "model.safetensors")
        max_diff = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    print("| step | sampler position | trained task ids | sampled outcomes | |loss diff| |")
    print("|---|---|---|---|---|")
    for x in report:
        print(f"| {x['step']} | {x['sampler']} | {x['tasks']} | {x['outcomes']} | {x['loss_diff']:.3g} |")
    launched = json.loads(archive.read_bytes(ref / "run.json")).get("launch")
    states = sorted(out.glob("state[0-9]*"))
    rng_entries = len(json.loads((states[-1] / "meta.json").read_text())["rng"]) if states else None
    print(f"launch: {launched}; stateNNN/ RNG entries: {rng_entries}")
    weights = (
        f"max |weight diff| in {last}: {max_diff:.3g}" if last else "no stepNNN/ kept: weights not compared"
    )
    print(f"eval seeds identical in {len(names)} files: {seeds}; {weights}")
    found = {"steps": report, "eval_files": len(names), "eval_seeds_equal": seeds}
    # the bitwise view: every field of every row but the timings (and the grader pool's own bookkeeping),
    # every eval row
    untimed = [[{k: v for k, v in r.items() if k not in UNCOMPARED} for r in rows] for rows in steps]
    found |= {
        "rows_identical": untimed[0] == untimed[1],
        "eval_rows_identical": all(e == f for e, f in evals),
    }
    found |= {"max_weight_diff": max_diff, "launch": launched, "rng_entries": rng_entries}
    print(
        f"rows identical (timings aside): {found['rows_identical']}; eval rows identical: {found['eval_rows_identical']}"
    )
    if report_path:
        report_path.write_text(json.dumps(found, indent=1))
    return found


if __name__ == "__main__":
    main()
