"""S0 vs S2 on a real pretrained chat model (issue 27; docs/experiment-real/PLAN.md), on one lent H200.

    python bench/real_experiment.py base  --gguf FILE --work W --out $OUT   # convert, base report, the rule's choice
    python bench/real_experiment.py train --work W --out $OUT --budget-s 500   # start or resume every run
    python bench/real_experiment.py base --smoke ... / train --smoke ...       # the same on a CPU, tiny

`base` converts the GGUF of SmolLM2-135M-Instruct (bases/packaged.py) into W/smollm2, writes the candidate
task snapshots (data/synthetic.py's `sum` family at levels 1 and 2) and measures the base on each candidate
cell (family x prompt x temperature) with the product's own evaluation code (trainer/evaluation.py's
generate_eval, compiled generation, grader v1): 8 samples of 128 training-pool problems at cap 256. The
outcome at a smaller cap c follows from the same samples (generation is causal: a completion that ended
within c tokens is the same completion under cap c; any other is truncated at c). PLAN.md's rule, `choose`
below, then picks the snapshot, temperature and cap; W/choice.json records it.

`train` runs every arm x seed of PLAN.md (`python -m trainer.train --config configs/smollm2.yaml ...`),
`--parallel` at a time on the one GPU, a seed's pair together, resuming (exactly) the runs an earlier command
left; when the budget is spent it sends SIGTERM (each run ends its step, saves it and exits; the next `train`
resumes it), then SIGINT to a run still going (it keeps its last saved state). `unpack` writes what a call
brought back into docs/experiment-real/<launch>/, and `report` prints the README's tables. Both commands pack what the
repository keeps (run.json, steps.jsonl, eval rows, run cards, logs, the base report; never weights) into
$OUT/real-experiment.tar.gz.
"""

import argparse
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file, Python puts bench/ on sys.path, not the repo root
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from data.prompt import SYSTEM_PROMPT  # noqa: E402

RECIPE = ROOT / "configs/smollm2.yaml"
ARCHIVE = "real-experiment.tar.gz"
ARMS = ("S0", "S2")
SEEDS = (0, 1, 2, 3, 4, 5)
# The pre-registered candidates and rule (PLAN.md): every number here is PLAN.md's.
FAMILIES = {"sum1": 1, "sum2": 2}  # snapshot name -> level of data/synthetic.py's `sum` family
CAPS = (64, 96, 128, 160, 192, 256)
REPORT_PROBLEMS, REPORT_SAMPLES, REPORT_CAP = 128, 8, 256
PASS_BAND, TRUNC_BAND, MIN_GATE_V1 = (0.05, 0.40), (0.08, 0.20), 0.30
FALLBACK_TRUNC = (0.05, 0.30)
SMOKE = {"problems": 2, "samples": 2, "cap": 24}
SMOKE_TRAIN = [
    "--max_steps", "1", "--groups_per_step", "2", "--num_generations", "2", "--problems_per_round", "2",
    "--per_device_train_batch_size", "4", "--heldout_size", "4", "--fixed_size", "2", "--fixed_samples", "2",
    "--eval_every", "1", "--eval_batch_size", "8", "--use_cpu", "true", "--bf16", "false",
    "--generation_rows", "4", "--report_to", "none",
]  # fmt: skip


def recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def cells() -> list[dict]:
    """The base report's cells: the recipe's few-shot prompt on both families at T 0.7 and 1.0, and the
    project's default prompt at T 1.0 on sum1 for reference (never chosen: it shows no format)."""
    few = recipe()["system_prompt"]
    out = [
        {"family": f, "prompt": "few-shot", "temperature": t, "system_prompt": few}
        for f in FAMILIES
        for t in (0.7, 1.0)
    ]
    return out + [{"family": "sum1", "prompt": "default", "temperature": 1.0, "system_prompt": SYSTEM_PROMPT}]


# --- the rule (PLAN.md) ------------------------------------------------------------------------------
def at_cap(rows: list[dict], cap: int) -> dict:
    """Outcome shares of the cap-256 samples as they would be at `cap`, and the gate shares of their groups."""
    outcomes = [r["outcome"] if r["completion_tokens"] <= cap else "truncated" for r in rows]
    n = len(outcomes)
    counts = Counter(outcomes)
    graded = n - counts["indeterminate"]
    groups: dict[str, list[str]] = {}
    for r, o in zip(rows, outcomes):
        groups.setdefault(r["task_id"], []).append(o)
    v1 = sum("correct" in g and "wrong" in g for g in groups.values())
    mixed = sum(0 < g.count("correct") < len(g) for g in groups.values())
    return {
        "cap": cap,
        "n": n,
        "pass@1": counts["correct"] / graded if graded else None,
        **{o: counts[o] / n for o in ("correct", "wrong", "format_rejected", "truncated", "indeterminate")},
        "gate_v1": v1 / len(groups),
        "mixed": mixed / len(groups),
    }


def choose(report: list[dict]) -> dict:
    """PLAN.md's rule. For each few-shot cell, the cap is the smallest of CAPS whose truncation share lies in
    TRUNC_BAND; the cell is eligible if its pass@1 there lies in PASS_BAND and its gate-v1 share is at least
    MIN_GATE_V1. The eligible cell with the largest gate-v1 share wins (ties: lower temperature, then sum1).
    If none is eligible: the (cell, cap) with the largest gate-v1 share whose truncation lies in
    FALLBACK_TRUNC and pass@1 in PASS_BAND, flagged `fallback`."""
    few = [c for c in report if c["prompt"] == "few-shot"]
    order = lambda c, cap: (-cap["gate_v1"], c["temperature"], c["family"])  # noqa: E731
    eligible = []
    for c in few:
        in_band = [k for k in c["caps"] if TRUNC_BAND[0] <= k["truncated"] <= TRUNC_BAND[1]]
        if not in_band:
            continue
        k = min(in_band, key=lambda k: k["cap"])
        if PASS_BAND[0] <= k["pass@1"] <= PASS_BAND[1] and k["gate_v1"] >= MIN_GATE_V1:
            eligible.append((c, k))
    fallback = not eligible
    if fallback:
        eligible = [
            (c, k)
            for c in few
            for k in c["caps"]
            if FALLBACK_TRUNC[0] <= k["truncated"] <= FALLBACK_TRUNC[1]
            and PASS_BAND[0] <= k["pass@1"] <= PASS_BAND[1]
        ]
    if not eligible:
        raise SystemExit("error: no candidate cell meets PLAN.md's rule or its fallback; see base_report.md")
    c, k = min(eligible, key=lambda ck: order(*ck))
    return {"family": c["family"], "temperature": c["temperature"], "cap": k["cap"], "fallback": fallback,
            "at_choice": k}  # fmt: skip


def report_md(report: list[dict], choice: dict, meta: dict) -> str:
    lines = [
        "# Base report: SmolLM2-135M-Instruct, before any training",
        "",
        f"{meta['problems']} training-pool problems x {meta['samples']} samples per cell, generated at cap "
        f"{meta['cap']} with the product's evaluation code ({meta['generation']} generation, grader v1, eval "
        f"seed 1234); a smaller cap's row counts every completion longer than it as truncated. "
        f"{meta['device']}, {meta['seconds']:.0f} s.",
        "",
        "| tasks | prompt | T | cap | pass@1 | correct | format-rejected | truncated | wrong | gate v1 | mixed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report:
        for k in c["caps"]:
            mark = " **chosen**" if (c["family"], c["temperature"], c["prompt"], k["cap"]) == (
                choice["family"], choice["temperature"], "few-shot", choice["cap"]) else ""  # fmt: skip
            lines.append(
                f"| {c['family']} | {c['prompt']} | {c['temperature']} | {k['cap']}{mark} | {k['pass@1']:.1%} | "
                f"{k['correct']:.1%} | {k['format_rejected']:.1%} | {k['truncated']:.1%} | {k['wrong']:.1%} | "
                f"{k['gate_v1']:.0%} | {k['mixed']:.0%} |"
            )
    lines += [
        "",
        f"Chosen by PLAN.md's rule: `{json.dumps({k: v for k, v in choice.items() if k != 'at_choice'})}`.",
    ]
    return "\n".join(lines) + "\n"


# --- command 1 ---------------------------------------------------------------------------------------
def snapshot_path(work: Path, family: str) -> Path:
    return work / f"{family}.tasks.json"


def base(work: Path, out: Path, gguf: Path | None, smoke: bool) -> int:
    import torch

    from bases.packaged import SOURCES, BaseError, convert, converted, locate
    from data.eval_sets import choose_eval_sets
    from data.snapshot import load_snapshot, write_snapshot
    from data.synthetic import generate_tasks
    from rewards.grader import GraderPool
    from trainer.evaluation import EvalSpec, generate_eval, load_checkpoint

    work.mkdir(parents=True, exist_ok=True)
    source, model_dir = SOURCES["smollm2"], work / "smollm2"
    t0 = time.perf_counter()
    if not converted(model_dir, source):
        try:
            convert(gguf or locate(source), model_dir, source)
        except BaseError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    print(f"converted in {time.perf_counter() - t0:.0f} s: {model_dir}", flush=True)
    shas = {
        f: write_snapshot(generate_tasks(1200, 0, (lv,), ("sum",)), snapshot_path(work, f))
        for f, lv in FAMILIES.items()
    }
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    model, tokenizer = load_checkpoint(model_dir, device)
    tokenizer.padding_side = "left"
    problems, samples, cap = (SMOKE["problems"], SMOKE["samples"], SMOKE["cap"]) if smoke else (
        REPORT_PROBLEMS, REPORT_SAMPLES, REPORT_CAP)  # fmt: skip
    generation = "compiled" if device == "cuda" else "eager"
    report, t0 = [], time.perf_counter()
    with GraderPool(workers=4 if device == "cuda" else 1, timeout_s=10, memory_mb=2048) as pool:
        for cell in cells():
            tasks = {t["id"]: t for t in load_snapshot(snapshot_path(work, cell["family"]))}
            sets = choose_eval_sets(list(tasks), seed=0, heldout_size=300, fixed_size=32)
            pool_ids = random.Random(0).sample(sorted(sets.train_pool), problems)
            spec = EvalSpec(cap=cap, temperature=cell["temperature"], top_p=1.0, seed=1234,
                            samples={"base": samples}, batch_size=512 if device == "cuda" else 8,
                            generation=generation, system_prompt=cell["system_prompt"])  # fmt: skip
            t1 = time.perf_counter()
            rows = generate_eval(
                model, tokenizer, [tasks[i] for i in pool_ids], spec, "base", grade_fn=pool.grade_batch
            )
            caps = [at_cap(rows, c) for c in (CAPS if not smoke else (cap // 2, cap))]
            report.append({**{k: v for k, v in cell.items() if k != "system_prompt"}, "caps": caps,
                           "seconds": round(time.perf_counter() - t1, 1)})  # fmt: skip
            with (work / f"base_rows_{cell['family']}_{cell['prompt']}_T{cell['temperature']}.jsonl").open(
                "w"
            ) as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            print(
                f"{cell['family']} {cell['prompt']} T={cell['temperature']}: {caps[-1]} ({report[-1]['seconds']} s)",
                flush=True,
            )
    choice = (
        choose(report) if not smoke else {"family": "sum1", "temperature": 1.0, "cap": cap, "fallback": False}
    )
    choice |= {"snapshot_sha256": shas[choice["family"]]}
    meta = {"problems": problems, "samples": samples, "cap": cap, "generation": generation,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "seconds": time.perf_counter() - t0}  # fmt: skip
    (work / "base_report.json").write_text(
        json.dumps({"meta": meta, "cells": report, "choice": choice}, indent=1) + "\n"
    )
    (work / "base_report.md").write_text(report_md(report, choice, meta))
    (work / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    print((work / "base_report.md").read_text(), flush=True)
    pack(work, out)
    return 0


# --- command 2 ---------------------------------------------------------------------------------------
def run_dir(work: Path, arm: str, seed: int) -> Path:
    return work / "runs" / f"smollm2-{arm}-s{seed}"


def finished(run: Path, max_steps: int) -> bool:
    steps = run / "results/steps.jsonl"
    if not steps.is_file():
        return False
    rows = [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]
    return (
        any(r.get("step") == max_steps for r in rows)
        and (run / f"results/eval_step{max_steps:03d}.jsonl").is_file()
    )


def prepare(work: Path, gguf: Path | None) -> dict | None:
    """A work directory for `train` without the base report: the converted base, the chosen snapshot and the
    committed choice (docs/experiment-real/base/base_report.json), the snapshot checked against its sha256."""
    from bases.packaged import SOURCES, BaseError, convert, converted, locate
    from data.snapshot import write_snapshot
    from data.synthetic import generate_tasks

    if (work / "choice.json").is_file():
        return json.loads((work / "choice.json").read_text())
    work.mkdir(parents=True, exist_ok=True)
    source, model_dir = SOURCES["smollm2"], work / "smollm2"
    if not converted(model_dir, source):
        try:
            convert(gguf or locate(source), model_dir, source)
        except BaseError as e:
            print(f"error: {e}", file=sys.stderr)
            return None
    choice = json.loads((DOCS / "base/base_report.json").read_text())["choice"]
    sha = write_snapshot(generate_tasks(1200, 0, (FAMILIES[choice["family"]],), ("sum",)),
                         snapshot_path(work, choice["family"]))  # fmt: skip
    if sha != choice["snapshot_sha256"]:
        print(f"error: {snapshot_path(work, choice['family'])}: sha256 {sha}, the base report chose "
              f"{choice['snapshot_sha256']}", file=sys.stderr)  # fmt: skip
        return None
    (work / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    return choice


# On the lent H200 (16 cores, 139 GiB, 64 GiB of disk) all twelve runs go at once (PLAN.md amendment 2): the GPU
# time-slices them (twelve ran no more steps in all than one, launch 4), but their host-side work (compiling,
# grading, Python) overlaps the others' GPU work, and the runs advance together, so the step that all twelve
# evaluated (PLAN.md's deviation rule) is as late as the device time allows. Each run fits one twelfth of the GPU:
# 256 rows per generate call, micro-batch 8 without checkpointing (the trainer's own choice assumes the whole
# GPU is its own), two grader workers, one intra-op thread; no periodic saves (12 x 6 x 1.9 GB would fill the disk;
# a stop saves its step, StopOnSignal, and the last step is always saved).
GPU_RUN_ARGS = ["--checkpoint_every", "0", "--generation_rows", "256", "--eval_batch_size", "256",
                "--per_device_train_batch_size", "8", "--gradient_checkpointing", "false", "--grader_workers", "2",
                "--nonfinite_gradient", "skip"]  # fmt: skip
GPU_SHARE = 0.9  # of the GPU's memory the runs may hold together, each sized by the leader's measured use
LEADER_S = 240  # a fresh start: the first run fills the compile caches (inductor's, on disk) for the others
GRACE_S = 75  # SIGTERM to the end of the step in progress and its save; then SIGINT (the last saved state)


def gpu_memory_mib(pid: int) -> tuple[float, float] | None:
    """(this process's GPU memory, the GPU's total) in MiB from nvidia-smi, or None where it cannot say."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [
        float(m) for p, m in (line.split(",") for line in apps.splitlines() if "," in line) if int(p) == pid
    ]
    return (used[0], float(total.split()[0])) if used and total.strip() else None


def fitting(parallel: int, leader_pid: int) -> int:
    """At most `parallel` runs, as many as GPU_SHARE of the GPU holds at the leader's measured memory."""
    memory = gpu_memory_mib(leader_pid)
    if memory is None:
        return parallel
    used, total = memory
    fit = max(1, min(parallel, int(GPU_SHARE * total // used)))
    print(f"leader holds {used:.0f} of {total:.0f} MiB: {fit} runs at a time", flush=True)
    return fit


def train(
    work: Path,
    out: Path,
    budget_s: float,
    smoke: bool,
    seeds: tuple[int, ...],
    gguf: Path | None,
    parallel: int,
) -> int:
    t0 = time.perf_counter()
    if (choice := prepare(work, gguf)) is None:
        return 1
    max_steps = 1 if smoke else int(recipe()["max_steps"])
    common = ["--model_name_or_path", str(work / "smollm2"), "--snapshot_path", str(snapshot_path(work, choice["family"])),
              "--snapshot_sha256", choice["snapshot_sha256"], "--temperature", str(choice["temperature"]),
              "--max_completion_length", str(choice["cap"]), *(SMOKE_TRAIN if smoke else GPU_RUN_ARGS)]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # fmt: skip
    (work / "runs").mkdir(parents=True, exist_ok=True)
    todo = [run_dir(work, a, s) for a in ARMS for s in seeds if not finished(run_dir(work, a, s), max_steps)]
    fresh = not any((r / "run.json").is_file() for r in todo)
    deadline = t0 + budget_s - GRACE_S
    procs = []

    def start(run: Path, arm: str, seed: int) -> None:
        cmd = [sys.executable, "-m", "trainer.train", "--config", str(RECIPE), "--arm", arm, "--seed", str(seed)]  # fmt: skip
        cmd += ["--resume", str(run)] if (run / "run.json").is_file() else ["--output_dir", str(run)]
        log = work / "runs" / f"{run.name}.log"
        with log.open("a") as f:
            f.write(f"\n$ {' '.join(cmd + common)}\n")
        procs.append((run, subprocess.Popen(cmd + common, cwd=ROOT, env=env, stdout=log.open("a"),
                                            stderr=subprocess.STDOUT, start_new_session=True)))  # fmt: skip

    queue = sorted(todo, key=lambda r: (int(r.name.rsplit("-s", 1)[1]), r.name))  # a seed's pair together

    def start_next() -> subprocess.Popen:
        run = queue.pop(0)
        arm, seed = re.fullmatch(r"smollm2-(S\d)-s(\d+)", run.name).groups()
        start(run, arm, int(seed))
        print(f"started {run.name} at {time.perf_counter() - t0:.0f} s", flush=True)
        return procs[-1][1]

    if fresh and len(queue) > 1:  # the first run alone until its first step row: generation compiled
        leader = start_next()
        steps = procs[0][0] / "results/steps.jsonl"
        while not steps.is_file() and leader.poll() is None and time.perf_counter() < t0 + LEADER_S:
            time.sleep(2)
        if leader.poll() not in (None, 0):  # the others would fail the same way
            log = (work / "runs" / f"{procs[0][0].name}.log").read_text().splitlines()
            print("\n".join(log[-25:]), file=sys.stderr)
            return 1
        parallel = fitting(parallel, leader.pid)
    while time.perf_counter() < deadline:
        live = [p for _, p in procs if p.poll() is None]
        if not live and not queue:
            break
        while queue and len(live) < parallel:
            live.append(start_next())
        time.sleep(5)
    stops = ((signal.SIGTERM, GRACE_S - 15), (signal.SIGINT, 10), (signal.SIGKILL, 5))
    for sig, wait_s in stops:  # each run ends its step and saves it; a run still going after that is cut
        live = [p for _, p in procs if p.poll() is None]
        for p in live:  # SIGTERM to the trainer alone: its grader workers must finish the step's grading
            (os.kill if sig == signal.SIGTERM else os.killpg)(p.pid, sig)
        end = time.perf_counter() + wait_s
        while any(p.poll() is None for p in live) and time.perf_counter() < end:
            time.sleep(1)
    for run, p in procs:
        p.wait()
        steps = run / "results/steps.jsonl"
        done = len(steps.read_text().splitlines()) if steps.is_file() else 0
        states = sorted(d.name for d in run.glob("state[0-9]*"))
        print(f"{run.name}: exit {p.returncode}, {done} step rows, states {states}, "
              f"finished={finished(run, max_steps)}", flush=True)  # fmt: skip
    print(f"train wall {time.perf_counter() - t0:.0f} s", flush=True)
    pack(work, out)
    return 0


def pack(work: Path, out: Path) -> Path:
    """What the repository keeps: never weights or optimizer state."""
    out.mkdir(parents=True, exist_ok=True)
    archive = out / ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            rel = path.relative_to(work).as_posix()
            if not path.is_file() or path.suffix == ".safetensors" or re.search(r"/(step|state)\d+/", rel):
                continue
            if rel.startswith("smollm2/") and not rel.endswith("base_manifest.json"):
                continue
            if rel.endswith(".tasks.json") or "/runs/" in f"/{rel}" and "tfevents" in rel:
                continue
            tar.add(path, arcname=f"real-experiment/{rel}")
    print(f"packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return archive


# --- the report's tables, from the committed rows (docs/experiment-real/README.md) ---------------------
DOCS = ROOT / "docs/experiment-real"


def _steps(run: Path) -> list[dict]:
    from rundir.files import read_jsonl

    return read_jsonl(run / "results/steps.jsonl")


def seed_table(where: Path, step: int = 2) -> str:
    """Exploratory, seed-level: the shares of the sampled training rollouts at `step` (after step - 1 updates)
    per training seed, S2 - S0, with the exact sign-flip test over the seeds (the training run as the unit)."""
    import statistics

    from analysis.stats import sign_flip_test

    lines = [
        "| seed | format-rejected S0 | S2 | S2 - S0 (pp) | correct S0 | S2 | S2 - S0 (pp) |",
        "|---|---|---|---|---|---|---|",
    ]
    diffs: dict[str, list[float]] = {"format_rejected": [], "correct": []}
    for seed in SEEDS:
        cells = []
        for outcome in diffs:
            share = {}
            for arm in ARMS:
                row = next(r for r in _steps(where / f"smollm2-{arm}-s{seed}") if r["step"] == step)
                share[arm] = 100 * row["outcomes_sampled"][outcome] / sum(row["outcomes_sampled"].values())
            diffs[outcome].append(share["S2"] - share["S0"])
            cells += [f"{share['S0']:.1f}%", f"{share['S2']:.1f}%", f"{diffs[outcome][-1]:+.1f}"]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    summary = []
    for outcome, d in diffs.items():
        t = sign_flip_test(d)
        summary.append(f"{outcome}: mean {statistics.mean(d):+.1f} pp, SD {statistics.stdev(d):.1f} pp over "
                       f"{len(d)} seeds, exact sign-flip p = {t.p_text()} ({t.describe()})")  # fmt: skip
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {x}" for x in summary) + "\n"


def trajectory_table(where: Path, seed: int = 0) -> str:
    """One seed per arm: evaluation at every evaluated step, and the training rows' entropy and logprob."""
    from rundir.files import Run

    lines = [
        "| step | S0 heldout300 | S2 heldout300 | S0 fixed32 | S2 fixed32 | format-rejected on heldout S0 / S2 | "
        "median length S0 / S2 | entropy S0 / S2 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    runs = {arm: Run(where / f"smollm2-{arm}-s{seed}") for arm in ARMS}
    entropy = {arm: {r["step"]: r["entropy_mean"] for r in _steps(run.dir)} for arm, run in runs.items()}
    for step in sorted(set(runs["S0"].evaluated()) | set(runs["S2"].evaluated())):
        cell = {}
        for arm, run in runs.items():
            held, fixed = run.score(step, "heldout300"), run.score(step, "fixed32")
            ent = entropy[arm].get(step)
            cell[arm] = (
                (f"{held.accuracy:.1%}", f"{fixed.accuracy:.1%}", f"{held.rate('format_rejected'):.1%}",
                 f"{held.median_tokens:g}", f"{ent:.3f}" if ent is not None else "–")
                if held else ("–",) * 5
            )  # fmt: skip
        a, b = cell["S0"], cell["S2"]
        lines.append(
            f"| {step} | {a[0]} | {b[0]} | {a[1]} | {b[1]} | {a[2]} / {b[2]} | {a[3]} / {b[3]} | {a[4]} / {b[4]} |"
        )
    return "\n".join(lines) + "\n"


LAUNCH4 = "launch4"  # amendment 1's twelve runs: <arm>-s<seed>/
LAUNCH6 = "launch6"  # amendment 2's twelve runs: to steps 24-29, S0-s1 failed at step 12
LAUNCH = "launch7"  # amendment 3's twelve runs, all to step 30: the plan's test


def failed(run: Path) -> bool:
    """PLAN.md: "a run that fails": one whose training applied a non-finite gradient (launch 6: its weights were
    then NaN, and it ended in the next generation's device assert; its log has the rest). A step whose update
    was skipped (amendment 3, `nonfinite_gradient: skip`) is not a failure."""
    return any(
        not math.isfinite(r.get("grad_norm", 0.0)) and not r.get("update_skipped") for r in _steps(run)
    )


def tested_seeds(where: Path) -> tuple[int, ...]:
    """PLAN.md: a failed run's seed pair is left out of the seed-level test."""
    return tuple(s for s in SEEDS if not any(failed(where / f"smollm2-{a}-s{s}") for a in ARMS))


def common_step(where: Path, seeds: tuple[int, ...] = SEEDS) -> int:
    """The last step that every run of `seeds` (both arms) evaluated: 30, or PLAN.md's deviation step."""
    from rundir.files import Run

    steps = [set(Run(where / f"smollm2-{a}-s{s}").evaluated()) for a in ARMS for s in seeds]
    return max(set.intersection(*steps))


def comparison_block(where: Path, seeds: tuple[int, ...], title: str) -> str:
    """S2 - S0 on heldout300 at the last step `seeds`' runs all evaluated, through analysis.compare: the
    seed-level test (the training run as the unit) and the problem-level one (given these checkpoints)."""
    import tempfile

    from analysis.compare import compare_runs
    from analysis.report import headline, seed_headline

    step = common_step(where, seeds)
    runs = {arm: ",".join(str(where / f"smollm2-{arm}-s{s}") for s in seeds) for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        c = compare_runs(runs["S2"], runs["S0"], tmp, step_a=step, step_b=step, primary="heldout300")
    deviation = "" if step == int(recipe()["max_steps"]) else ", PLAN.md's deviation step"
    return (
        f"### {title}: S2 − S0, heldout300, step {step}{deviation}, seeds {', '.join(map(str, seeds))}\n\n"
        f"Seed-level test:\n\n{seed_headline(c)}\n\n"
        f"Problem-level test, given these {2 * len(seeds)} checkpoints:\n\n{headline(c)}\n"
    )


def primary_block(where: Path) -> str:
    """PLAN.md's primary: the seeds whose runs did not fail, at the last step all their runs evaluated; then the
    same comparison over all six seeds at the last step that all twelve runs evaluated (a sensitivity reading)."""
    seeds = tested_seeds(where)
    out = comparison_block(where, seeds, "Primary")
    if seeds != SEEDS:
        out += "\n" + comparison_block(where, SEEDS, "Sensitivity, every seed (not the primary)")
    return out


def arm_trajectory(where: Path, seeds: tuple[int, ...] = SEEDS) -> str:
    """Per arm, the mean over `seeds` at every evaluated step: accuracy, unresolved shares and length on
    heldout300, and the training rows' entropy and median sampled-token logprob (the seed card's collapse)."""
    import statistics

    from rundir.files import Run

    lines = [
        "| step | heldout300 S0 / S2 | fixed32 S0 / S2 | format-rejected (heldout) S0 / S2 | truncated (heldout) "
        "S0 / S2 | median length S0 / S2 | entropy S0 / S2 | median logprob S0 / S2 |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip

    def metrics(run: Run, rows: dict, step: int) -> list[float | None]:
        held, fixed, row = run.score(step, "heldout300"), run.score(step, "fixed32"), rows.get(step, {})
        return [100 * held.accuracy, 100 * fixed.accuracy, 100 * held.rate("format_rejected"),
                100 * held.rate("truncated"), held.median_tokens, row.get("entropy_mean"),
                row.get("logprob_median")]  # fmt: skip

    per_arm = {
        arm: [(Run(where / f"smollm2-{arm}-s{s}"), {r["step"]: r for r in _steps(where / f"smollm2-{arm}-s{s}")})
              for s in seeds]
        for arm in ARMS
    }  # fmt: skip
    formats = ("{:.1f}",) * 5 + ("{:.3f}",) * 2
    for step in range(0, common_step(where, seeds) + 1, int(recipe()["eval_every"])):
        means = {}
        for arm, runs in per_arm.items():
            columns = zip(*(metrics(run, rows, step) for run, rows in runs))
            means[arm] = [None if None in col else statistics.mean(col) for col in columns]
        cells = [
            " / ".join("–" if means[arm][i] is None else fmt.format(means[arm][i]) for arm in ARMS)
            for i, fmt in enumerate(formats)
        ]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def launch_status(where: Path) -> str:
    """Per run of a launch: the steps it logged, the steps whose update it skipped (a non-finite gradient,
    amendment 3) and the steps it evaluated."""
    from rundir import archive
    from rundir.files import Run

    lines = ["| run | steps logged | updates skipped at steps | evaluated at steps |", "|---|---|---|---|"]
    for arm in ARMS:
        for seed in SEEDS:
            run = where / f"smollm2-{arm}-s{seed}"
            rows = _steps(run) if archive.exists(run / "results/steps.jsonl") else []
            skipped = ", ".join(str(r["step"]) for r in rows if r.get("update_skipped")) or "none"
            evaluated = ", ".join(map(str, Run(run).evaluated()))
            lines.append(
                f"| {run.name} | {max((r['step'] for r in rows), default=0)} | {skipped} | {evaluated} |"
            )
    return "\n".join(lines) + "\n"


def heldout_outcome_table(where: Path, steps: tuple[int, ...], outcome: str = "format_rejected") -> str:
    """Exploratory, seed-level: S2 - S0 in the heldout300 share of `outcome` per training seed at each of
    `steps` (over the seeds whose two runs both evaluated it), with the exact sign-flip test over the seeds."""
    import statistics

    from analysis.stats import sign_flip_test
    from rundir.files import Run

    lines = ["| step | seeds | S2 - S0 per seed (pp) | mean (pp) | SD (pp) | seeds with S2 lower | p (exact sign-flip) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for step in steps:
        runs = {s: [Run(where / f"smollm2-{a}-s{s}") for a in ("S2", "S0")] for s in SEEDS}
        seeds = [s for s, pair in runs.items() if all(step in r.evaluated() for r in pair)]
        d = [100 * (runs[s][0].score(step, "heldout300").rate(outcome) - runs[s][1].score(step, "heldout300").rate(outcome))
             for s in seeds]  # fmt: skip
        lines.append(f"| {step} | {', '.join(map(str, seeds))} | {', '.join(f'{x:+.1f}' for x in d)} | "
                     f"{statistics.mean(d):+.1f} | {statistics.stdev(d):.1f} | {sum(x < 0 for x in d)} of {len(d)} | "
                     f"{sign_flip_test(d).p_text()} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def reproduction_table(new: Path, old: Path, eval_steps: tuple[int, ...] = (0, 5, 10)) -> str:
    """Run by run, how far launch `new` repeats launch `old` (the same seeds and code paths): the leading
    training steps whose sampled outcomes, trained tasks and loss are the same, and the evaluation samples
    whose completions are the same text at `eval_steps`."""
    from rundir.files import read_jsonl

    head = " | ".join(f"same completions, step {s}" for s in eval_steps)
    lines = [f"| run | identical leading training steps | {head} |", "|---" * (2 + len(eval_steps)) + "|"]
    keys = ("outcomes_sampled", "task_ids_trained", "loss")
    for arm in ARMS:
        for seed in SEEDS:
            a, b = (w / f"smollm2-{arm}-s{seed}" for w in (new, old))
            same = 0
            for x, y in zip(_steps(a), _steps(b)):
                if any(x[k] != y[k] for k in keys):
                    break
                same += 1
            cells = []
            for step in eval_steps:
                ra, rb = (read_jsonl(r / f"results/eval_step{step:03d}.jsonl") for r in (a, b))
                cells.append(
                    f"{sum(x['completion'] == y['completion'] for x, y in zip(ra, rb))} of {len(ra)}"
                )
            lines.append(f"| {a.name} | {same} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def timing_table(run: Path) -> str:
    """One run's seconds per phase at every step, and its evaluations (heldout300, fixed32, format-rejected)."""
    from rundir.files import Run

    r = Run(run)
    lines = ["| step | generate (s) | grade (s) | train (s) | eval (s) | heldout300 | fixed32 | format-rejected "
             "(heldout) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in [{"step": 0, "seconds": {}}, *_steps(run)]:
        sec, step = row["seconds"], row["step"]
        held, fixed = r.score(step, "heldout300"), r.score(step, "fixed32")
        scores = (
            [f"{held.accuracy:.1%}", f"{fixed.accuracy:.1%}", f"{held.rate('format_rejected'):.1%}"]
            if held
            else ["–"] * 3
        )
        times = [f"{sec[k]:.1f}" if sec.get(k) else "–" for k in ("generate", "grade", "train", "eval")]
        lines.append(f"| {step} | " + " | ".join(times + scores) + " |")
    return "\n".join(lines) + "\n"


def report(where: Path = DOCS) -> str:
    """The README's tables, recomputed from the committed rows."""
    launch, launch6 = where / LAUNCH, where / LAUNCH6
    seeds6 = ", ".join(map(str, tested_seeds(launch6)))
    return (
        primary_block(launch)
        + "\n### Exploratory: S2 − S0 in the heldout300 format-rejected share, per seed (launch 7)\n\n"
        + heldout_outcome_table(launch, (10, 20, 30))
        + f"\n### Per arm, mean over seeds {', '.join(map(str, tested_seeds(launch)))}, every evaluation (launch 7)\n\n"
        + arm_trajectory(launch, tested_seeds(launch))
        + "\n### Launch 7: how far each run got\n\n"
        + launch_status(launch)
        + "\n### Launch 7 against launch 6, run by run (the same seeds and code paths)\n\n"
        + reproduction_table(launch, launch6)
        + "\n### Launch 6 (amendment 2), as it was reported\n\n"
        + primary_block(launch6).replace("### ", "#### ")
        + f"\n#### Launch 6 per arm, mean over seeds {seeds6}, every evaluation\n\n"
        + arm_trajectory(launch6, tested_seeds(launch6))
        + "\n#### Launch 6: how far each run got\n\n"
        + launch_status(launch6)
        + "\n#### Launch 6: S2 − S0 in the heldout300 format-rejected share, per seed\n\n"
        + heldout_outcome_table(launch6, (10, 20))
        + "\n### Launch 7, step 2: the sampled training rollouts per seed (after one update)\n\n"
        + seed_table(launch)
        + "\n### Launch 6, step 2 (the same seeds)\n\n"
        + seed_table(launch6)
        + "\n### Launch 4 against launch 2 at step 2 (the same seeds: a reproduction, not a replication)\n\n"
        + seed_table(where / LAUNCH4)
        + "\n### One run alone on the H200 (launch 5: S2, seed 0, the trainer's own micro-batch)\n\n"
        + timing_table(where / "solo/smollm2-S2-s0")
        + "\n### Training seeds 0-5, step 2 (launch 2, exploratory)\n\n"
        + seed_table(where / "attempt2")
        + "\n### Seed 0, every evaluation (launch 3, exploratory)\n\n"
        + trajectory_table(where / "runs")
    )


def unpack(archive: Path, into: Path) -> int:
    """The archive `train` packed, into the committed layout: <into>/smollm2-<arm>-s<seed>/ (run.json,
    results/, card) with its log beside it; refuses to write over anything already there."""
    if into.exists():
        print(f"error: {into}: exists; unpack into a new folder", file=sys.stderr)
        return 1
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            rel = Path(member.name).relative_to("real-experiment")
            if not member.isfile() or rel.parts[0] != "runs":
                continue
            target = into / Path(*rel.parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
    print(f"unpacked {archive} into {into}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/real_experiment.py", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("base", "train", "report", "unpack"))
    ap.add_argument("--work", type=Path, default=ROOT / "artifacts/real-experiment")
    ap.add_argument("--out", type=Path, default=None, help="what comes back (default $OUT, else <work>/out)")
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF (default: the installed package's)")
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument(
        "--parallel", type=int, default=12, help="train: runs at a time on the GPU (default: all)"
    )
    ap.add_argument("--smoke", action="store_true", help="CPU sizes: 1 step, tiny eval sets")
    ap.add_argument(
        "--archive", type=Path, help="unpack: the real-experiment.tar.gz a train call brought back"
    )
    ap.add_argument(
        "--into", type=Path, required=False, help="unpack: the new folder (docs/experiment-real/<launch>)"
    )
    args = ap.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or args.work / "out")
    work = args.work.resolve()
    if args.command == "report":
        print(report(), end="")
        return 0
    if args.command == "unpack":
        return unpack(args.archive, args.into)
    if args.command == "base":
        return base(work, out, args.gguf, args.smoke)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    return train(work, out, args.budget_s, args.smoke, seeds, args.gguf, args.parallel)


if __name__ == "__main__":
    sys.exit(main())
