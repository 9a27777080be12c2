"""The seed's S0-vs-S2 experiment at GPU scale on one H200 (issue 20), in two device commands.

    python bench/h200_experiment.py base  --work /tmp/capgrpo-h200 --out $OUT   # command 1: build the base
    python bench/h200_experiment.py train --work /tmp/capgrpo-h200 --out $OUT   # command 2: S0 + S2, compare, pack
    python bench/h200_experiment.py all --smoke --work /tmp/h200-smoke           # both, tiny, on a CPU

`base` builds the base of configs/h200-base.json with `python -m embedded.build --overrides ...`, its report at
the cap of configs/h200.yaml, into <work>/base (weights stay there: the second command reads them, so it must
run on the same machine while it is still held). `train` runs `python -m trainer.experiment --recipe
configs/h200.yaml --arms S0,S2 --jobs 2` (both arms at once on the one GPU) from that base, stops the runs
when --budget-s is spent, compares S2 with S0 at the last step both evaluated, writes the throughput summary
(steps/s, tokens/s, the share of step time in generation, from steps.jsonl's `seconds`) and packs the
reports, plots, steps.jsonl, eval files and logs (no weights) into <out>/h200-experiment.tar.gz. Every
command leaves at most 4 files in <out> (the device machine returns 8). `--smoke` shrinks the base, the
batch, the cap and the eval sets to CPU sizes (the same code path but compiled generation, bf16 and the GPU).
docs/experiment-h200/README.md has the exact device commands, the measured wall times and the result.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# run as a file, Python puts bench/ on sys.path, not the repo root that embedded.build (check_base) lives in
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from rundir.files import Run, read_jsonl, steps_path  # noqa: E402

RECIPE = ROOT / "configs/h200.yaml"
BASE_OVERRIDES = ROOT / "configs/h200-base.json"
ARMS = ("S0", "S2")
ARCHIVE = "h200-experiment.tar.gz"

# CPU sizes for --smoke: a base of a few thousand parameters (the 8-layer pattern kept), 3 SFT steps,
# 2 training steps of 2 groups, a 48-token cap and 6 + 3x2 eval samples
SMOKE_CAP = 48
SMOKE_BASE = [
    "tokenizer_corpus_size=200", "hidden_size=32", "intermediate_size=64", "num_attention_heads=2",
    "num_key_value_heads=1", "head_dim=16", "linear_num_key_heads=1", "linear_num_value_heads=2",
    "linear_head_dim=16", "sft_steps=3", "sft_batch_size=4", "sft_pool_size=48", "sft_max_length=160",
    "sft_bf16=false",
]  # fmt: skip
SMOKE_TRAIN = [
    "--max_steps", "2", "--groups_per_step", "2", "--problems_per_round", "3", "--per_device_train_batch_size", "8",
    "--heldout_size", "6", "--fixed_size", "3", "--fixed_samples", "2", "--eval_every", "1",
    "--eval_batch_size", "16", "--max_completion_length", str(SMOKE_CAP), "--checkpoint_steps", "2",
    "--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--compiled_generation", "false", "--grader_workers", "1",
    "--report_to", "none",
]  # fmt: skip


def recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def base_settings(smoke: bool) -> tuple[list[str], int]:
    """The builder's --set pairs beyond configs/h200-base.json, and the report cap."""
    return (SMOKE_BASE, SMOKE_CAP) if smoke else ([], int(recipe()["max_completion_length"]))


def expected_config(smoke: bool):
    from embedded.build import BuildConfig, _overrides

    pairs, _ = base_settings(smoke)
    fields = _overrides([], str(BASE_OVERRIDES))
    fields.update(_overrides(pairs))
    return BuildConfig(**fields)


def run_logged(cmd: list[str], log: Path, budget_s: float | None = None) -> tuple[int, float, bool]:
    """Run `cmd` in its own process group, output to `log` and ours; stop the group when the budget is
    spent. Returns (exit code, seconds, whether it was stopped)."""
    print(f"$ {' '.join(cmd)}  (log {log})", flush=True)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        stopped = False
        try:
            proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            stopped = True
            os.killpg(proc.pid, signal.SIGTERM)  # the experiment and the runs it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.perf_counter() - t0
    print(log.read_text()[-4000:], flush=True)
    return proc.returncode, seconds, stopped


# --- command 1: the base ------------------------------------------------------------------------
def build(work: Path, out: Path, smoke: bool, budget_s: float) -> int:
    pairs, cap = base_settings(smoke)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "embedded.build", "--out", str(work / "base")]
    cmd += ["--snapshot", str(work / "synthetic.tasks.json"), "--overrides", str(BASE_OVERRIDES)]
    cmd += ["--report-cap", str(cap), "--eval-problems", "4" if smoke else "300"]
    cmd += [a for p in pairs for a in ("--set", p)]
    code, seconds, stopped = run_logged(cmd, work / "base.log", budget_s)
    (out / "base.log").write_bytes((work / "base.log").read_bytes())
    for name in ("tiny_base.json", "base_report.json"):
        if (work / "base" / name).is_file():
            (out / name).write_bytes((work / "base" / name).read_bytes())
    if stopped or code:
        why = f"stopped after {seconds:.0f} s (--budget-s)" if stopped else f"exit {code}"
        print(f"error: the base build {why}; see {out / 'base.log'}", file=sys.stderr)
        return 1
    print(f"base built in {seconds:.0f} s: {work / 'base'}")
    return 0


def check_base(work: Path, smoke: bool) -> str | None:
    """Why <work>/base cannot be trained from, or None."""
    from embedded.build import MANIFEST, is_complete

    base = work / "base"
    if not is_complete(base, expected_config(smoke)):
        return (
            f"{base}: no complete build of configs/h200-base.json{' (smoke)' if smoke else ''} ({MANIFEST} missing or "
            "of another config): run `base` first, on the same machine (the weights do not come back)"
        )
    pinned = recipe()["snapshot_sha256"]
    built = json.loads((base / MANIFEST).read_text()).get("snapshot", {}).get("sha256")
    if built != pinned:
        return f"{base / MANIFEST}: snapshot sha256 {built} is not the one {RECIPE.name} pins ({pinned})"
    return None


# --- command 2: S0 and S2, the comparison, the summary -----------------------------------------
def evaluated_steps(run: Path) -> set[int]:
    """Steps with an eval file at the run's own cap."""
    return set(Run(run).evaluated())


def throughput(run: Path) -> dict:
    """Steps/s, tokens/s and the share of step time in generation, from results/steps.jsonl's `seconds`.

    Step time is generate + grade + train + eval + save (`grade_lost` is part of grade); generated tokens
    are the sampled rollouts' completion tokens (count x mean length: real tokens, not the compiled path's
    fillers); "warm" leaves out step 1, which pays the compilation of the decode step."""
    rows = read_jsonl(steps_path(run))

    def stats(rows: list[dict]) -> dict:
        if not rows:
            return {"steps": 0}
        sec = {
            k: sum(r["seconds"].get(k, 0.0) for r in rows)
            for k in ("generate", "grade", "train", "eval", "save")
        }
        total = sum(sec.values())
        generated = sum(sum(r["outcomes_sampled"].values()) * r["completion_length"]["mean"] for r in rows)
        trained = sum(r["tokens_trained"] for r in rows)
        return {
            "steps": len(rows),
            "seconds": {k: round(v, 2) for k, v in sec.items()} | {"step_total": round(total, 2)},
            "steps_per_s": len(rows) / total,
            "generated_tokens": round(generated),
            "generated_tokens_per_s_of_generation": generated / max(sec["generate"], 1e-9),
            "generated_tokens_per_s_of_step_time": generated / total,
            "trained_tokens_per_s_of_train_time": trained / max(sec["train"], 1e-9),
            "generation_share": sec["generate"] / total,
            "generation_share_without_eval": sec["generate"] / max(total - sec["eval"], 1e-9),
            "median_step_s": statistics.median(sum(r["seconds"].get(k, 0.0) for k in sec) for r in rows),
            "sampling_rounds_mean": statistics.mean(r["groups"]["rounds"] for r in rows),
            "sampled_per_trained_group": sum(r["groups"]["sampled"] for r in rows)
            / max(1, sum(r["groups"]["trained"] for r in rows)),
        }

    return {"all": stats(rows), "warm": stats(rows[1:])}


def summary_md(summary: dict) -> str:
    lines = [
        f"# H200 experiment summary ({summary['mode']})",
        "",
        f"- machine: {summary['device']}; torch {summary['versions']['torch']}, transformers "
        f"{summary['versions']['transformers']}, trl {summary['versions']['trl']}",
        f"- training wall time (both arms at once): {summary['train_wall_s']:.0f} s"
        + (" (stopped at the budget)" if summary["stopped"] else ""),
        f"- compared at step {summary['compared_step']}; report: comparisons/S2_vs_S0/report.md in {ARCHIVE}",
        "",
        "| arm | steps | steps/s | generated tok/s (generation) | generated tok/s (step) | trained tok/s | "
        "generation share | without eval | median step s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, t in summary["throughput"].items():
        for part in ("all", "warm"):
            s = t[part]
            if not s["steps"]:
                continue
            lines.append(
                f"| {arm} ({part}) | {s['steps']} | {s['steps_per_s']:.3f} | "
                f"{s['generated_tokens_per_s_of_generation']:.0f} | {s['generated_tokens_per_s_of_step_time']:.0f} | "
                f"{s['trained_tokens_per_s_of_train_time']:.0f} | {s['generation_share']:.1%} | "
                f"{s['generation_share_without_eval']:.1%} | {s['median_step_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def pack(work: Path, out: Path) -> Path:
    """Reports, plots, steps.jsonl, eval files, run cards and logs; never weights or optimizer state."""
    keep = re.compile(
        r"(run\.json|README\.md|results/.*|.*\.log|comparisons/.*|base/(tiny_base|base_report)\.json)$"
    )
    archive = out / ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            rel = path.relative_to(work).as_posix()
            if out.resolve() in path.parents or not path.is_file() or rel.endswith(".safetensors"):
                continue
            if keep.search(rel):
                if rel.startswith("runs/") and re.search(r"/(step|state)\d+/", rel):
                    continue
                tar.add(path, arcname=f"h200-experiment/{rel}")
    return archive


def train(work: Path, out: Path, smoke: bool, budget_s: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    why = check_base(work, smoke)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    runs, comparisons = work / "runs", work / "comparisons"
    cmd = [sys.executable, "-m", "trainer.experiment", "--recipe", str(RECIPE), "--arms", ",".join(ARMS)]
    cmd += ["--runs", str(runs), "--out", str(comparisons), "--jobs", str(len(ARMS))]
    cmd += ["--", "--model_name_or_path", str(work / "base"), *(SMOKE_TRAIN if smoke else [])]
    code, seconds, stopped = run_logged(cmd, work / "experiment.log", budget_s)
    (out / "experiment.log").write_bytes((work / "experiment.log").read_bytes())
    if code and not stopped:
        print(f"error: the experiment failed (exit {code}); see {out / 'experiment.log'}", file=sys.stderr)
        pack(work, out)
        return 1
    common = set.intersection(*(evaluated_steps(runs / arm) for arm in ARMS))
    compared = max(common) if common else None
    if stopped and compared:  # a finished experiment has compared at the last step; a stopped one has not
        cmp = [sys.executable, "-m", "analysis.compare", str(runs / "S2"), str(runs / "S0")]
        cmp += ["--a-step", str(compared), "--b-step", str(compared), "--out", str(comparisons / "S2_vs_S0")]
        if run_logged(cmp, work / "compare.log")[0]:
            print(f"error: the comparison failed; see {work / 'compare.log'}", file=sys.stderr)
    import torch
    import transformers
    import trl

    summary = {
        "mode": "smoke, CPU sizes" if smoke else "full",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "versions": {m.__name__: m.__version__ for m in (torch, transformers, trl)},
        "command": " ".join(cmd),
        "train_wall_s": round(seconds, 1),
        "stopped": stopped,
        "compared_step": compared,
        "throughput": {
            arm: throughput(runs / arm) for arm in ARMS if (runs / arm / "results/steps.jsonl").is_file()
        },
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (work / "summary.md").write_text(summary_md(summary))
    for name in ("summary.json", "summary.md"):
        (out / name).write_bytes((work / name).read_bytes())
    archive = pack(work, out)
    print((work / "summary.md").read_text())
    print(f"packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
    return 0 if compared else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/h200_experiment.py", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("base", "train", "all"))
    ap.add_argument("--work", type=Path, default=ROOT / "artifacts/h200", help="base, runs, comparisons")
    ap.add_argument("--out", type=Path, default=None, help="what comes back (default $OUT, else <work>/out)")
    ap.add_argument("--smoke", action="store_true", help="CPU sizes: a tiny base, 2 steps, small eval sets")
    ap.add_argument(
        "--budget-s", type=float, default=None, help="stop the build / the training after this (540 / 500 s)"
    )
    args = ap.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or args.work / "out")
    work = args.work.resolve()
    if args.command in ("base", "all"):
        if build(work, out, args.smoke, args.budget_s or 540):
            return 1
    if args.command in ("train", "all"):
        if (work / "runs").exists() and any((work / "runs").iterdir()):
            print(f"error: {work / 'runs'} is not empty: remove it or pass another --work", file=sys.stderr)
            return 1
        return train(work, out, args.smoke, args.budget_s or 500)
    return 0


if __name__ == "__main__":
    sys.exit(main())
