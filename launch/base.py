"""The base stage: build the base, write the task snapshots, measure the base on the plan's grid, apply its rule.

Every cell is sampled once at the grid's longest cap with the product's evaluation code (trainer/evaluation.py's
generate_eval, grader v1). The outcome at a smaller cap follows from the same samples: generation is causal, so a
completion that ended within c tokens is the same completion under cap c, and any other is truncated at c. The
plan's rule (`choose`) then fixes tasks, temperature, model and cap; <work>/choice.json records it for the runs.
"""

import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from launch.plan import ROOT, LaunchError, Plan, PlanError, Rule
from policy.arms import GATES
from rewards.outcome import Outcome

SMOKE = {"problems": 2, "samples": 2, "cap": 24}


def cell_tasks(cell: dict) -> str:
    return cell.get("tasks", cell.get("family"))  # the SmolLM2 base report (issue 27) named it `family`


def at_cap(rows: list[dict], cap: int) -> dict:
    """Outcome shares of the long-cap samples as they would be at `cap`, and the gate shares of their groups."""
    outcomes = [r["outcome"] if r["completion_tokens"] <= cap else "truncated" for r in rows]
    n = len(outcomes)
    counts = Counter(outcomes)
    graded = n - counts["indeterminate"]
    groups: dict[str, list[str]] = {}
    for r, o in zip(rows, outcomes):
        groups.setdefault(r["task_id"], []).append(o)
    v1 = sum(GATES["v1"](map(Outcome, g)) for g in groups.values())  # the trainer's own gate
    mixed = sum(0 < g.count("correct") < len(g) for g in groups.values())
    return {
        "cap": cap,
        "n": n,
        "pass@1": counts["correct"] / graded if graded else None,
        **{o: counts[o] / n for o in ("correct", "wrong", "format_rejected", "truncated", "indeterminate")},
        "gate_v1": v1 / len(groups),
        "mixed": mixed / len(groups),
    }


def choose(cells: list[dict], rule: Rule) -> dict:
    """The plan's rule (launch/plan.py Rule); raises LaunchError if neither it nor its fallback picks a cell."""
    inside = lambda x, band: x is not None and band[0] <= x <= band[1]  # noqa: E731
    candidates = [c for c in cells if all(c.get(k) == v for k, v in rule.candidates.items())]

    def order(c: dict, k: dict) -> tuple:
        return (-k[rule.gate], *((cell_tasks(c) if f == "tasks" else c.get(f)) for f in rule.tie_break))

    eligible = []
    for c in candidates:
        in_band = [k for k in c["caps"] if inside(k["truncated"], rule.truncated)]
        if not in_band:
            continue
        k = min(in_band, key=lambda k: k["cap"])
        if inside(k["pass@1"], rule.pass_at_1) and k[rule.gate] >= rule.min_gate:
            eligible.append((c, k))
    fallback = not eligible
    if fallback and rule.fallback_truncated:
        eligible = [(c, k) for c in candidates for k in c["caps"]
                    if inside(k["truncated"], rule.fallback_truncated) and inside(k["pass@1"], rule.pass_at_1)]  # fmt: skip
    if not eligible:
        raise LaunchError("no candidate cell meets the plan's rule or its fallback; see base_report.md")
    c, k = min(eligible, key=lambda ck: order(*ck))
    model = {"model": c["model"]} if "model" in c else {}
    return {"tasks": cell_tasks(c), **model, "temperature": c["temperature"], "cap": k["cap"],
            "fallback": fallback, "at_choice": k}  # fmt: skip


def finished_accuracy(k: dict) -> str:
    """Correct among the answers that ended within the cap (not truncated, grader not failed): what S2 can
    convert when it makes the model finish (issue 62), from at_cap's shares."""
    finished = k["correct"] + k["wrong"] + k["format_rejected"]
    return f"{k['correct'] / finished:.1%}" if finished else "–"


def report_md(plan: Plan, cells: list[dict], choice: dict, meta: dict) -> str:
    lines = [
        f"# Base report: {plan.name}, before any training",
        "",
        f"{meta['problems']} training-pool problems x {meta['samples']} samples per cell, generated at cap "
        f"{meta['cap']} with the product's evaluation code ({meta['generation']} generation, grader v1, eval "
        f"seed 1234); a smaller cap's row counts every completion longer than it as truncated. "
        f"{meta['device']}, {meta['seconds']:.0f} s.",
        "",
        "| tasks | model | prompt | T | cap | pass@1 | correct | format-rejected | truncated | wrong | gate v1 | mixed | "
        "correct among finished |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    candidates = plan.base_report.rule.candidates if plan.base_report.rule else {}
    for c in cells:
        for k in c["caps"]:
            chosen = (cell_tasks(c), c.get("model"), c["temperature"], k["cap"]) == (
                choice["tasks"], choice.get("model"), choice["temperature"], choice["cap"]) and all(
                c.get(f) == v for f, v in candidates.items())  # fmt: skip
            p1 = "–" if k["pass@1"] is None else f"{k['pass@1']:.1%}"
            lines.append(
                f"| {cell_tasks(c)} | {c.get('model', plan.name)} | {c['prompt']} | {c['temperature']} | "
                f"{k['cap']}{' **chosen**' if chosen else ''} | {p1} | {k['correct']:.1%} | "
                f"{k['format_rejected']:.1%} | {k['truncated']:.1%} | {k['wrong']:.1%} | {k['gate_v1']:.0%} | "
                f"{k['mixed']:.0%} | {finished_accuracy(k)} |"
            )
    shown = {k: v for k, v in choice.items() if k != "at_choice"}
    return "\n".join([*lines, "", f"Chosen by the plan's rule: `{json.dumps(shown)}`."]) + "\n"


def compare_md(reports: dict[str, dict]) -> str:
    """Several bases' reports side by side (issue 62: the 1.5B's cells against the 0.5B's), one row per
    (temperature, cap): truncated share, pass@1, correct among finished answers and the gate-v1 share per base;
    each base's chosen cell in bold."""
    names = list(reports)
    head = " | ".join(f"{n}: truncated / pass@1 / correct among finished / gate v1" for n in names)
    lines = [f"| T | cap | {head} |", "|---|---|" + "---|" * len(names)]
    keys = sorted(
        {(c["temperature"], k["cap"]) for r in reports.values() for c in r["cells"] for k in c["caps"]}
    )
    for t, cap in keys:
        cols = []
        for r in reports.values():
            k = next(
                (k for c in r["cells"] if c["temperature"] == t for k in c["caps"] if k["cap"] == cap), None
            )
            text = "–" if k is None else (f"{k['truncated']:.1%} / {k['pass@1']:.1%} / {finished_accuracy(k)} / "
                                          f"{k['gate_v1']:.0%}")  # fmt: skip
            chosen = (r["choice"]["temperature"], r["choice"]["cap"]) == (t, cap)
            cols.append(f"**{text}**" if chosen and k is not None else text)
        lines.append(f"| {t} | {cap} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


# --- building what the runs start from --------------------------------------------------------------------
def snapshot_path(work: Path, name: str) -> Path:
    return work / f"{name}.tasks.json"


def write_tasks(plan: Plan, work: Path, name: str) -> str:
    """The snapshot `name` at <work>/<name>.tasks.json; returns its sha256 (checked against the plan's, if any)."""
    from data.snapshot import load_snapshot, write_snapshot

    spec = plan.tasks.get(name)
    if spec is None:
        raise PlanError(f"{plan.path}: tasks has no snapshot {name!r}")
    target = snapshot_path(work, name)
    if spec.get("generator") == "synthetic":
        from data.synthetic import generate_tasks

        sha = write_snapshot(generate_tasks(spec["size"], spec["seed"], tuple(spec["levels"]), (spec["family"],)),
                             target)  # fmt: skip
    elif "path" in spec:  # a committed snapshot (data/), copied and checked
        source = ROOT / spec["path"]
        load_snapshot(source, spec.get("sha256"))
        target.write_bytes(source.read_bytes())
        sha = spec.get("sha256") or __import__("hashlib").sha256(target.read_bytes()).hexdigest()
    else:
        raise PlanError(f"{plan.path}: tasks.{name} has neither generator: synthetic nor path")
    if spec.get("sha256") and sha != spec["sha256"]:
        raise LaunchError(f"{target}: sha256 {sha}, the plan pins {spec['sha256']}")
    return sha


def build_base(plan: Plan, work: Path, model: str | None, smoke: bool, gguf: Path | None = None) -> Path:
    """The base's directory under `work`: a packaged model converted (bases/packaged.py), an embedded build
    (embedded/build.py), or in --smoke the shipped tiny embedded base as it is."""
    if smoke:
        return ROOT / "embedded/base"
    kind = plan.base["kind"]
    if kind == "packaged":
        from bases.packaged import SOURCES, BaseError, convert, converted, locate

        name = model or plan.base["model"]
        source, out = SOURCES[name], work / name
        if not converted(out, source):
            try:
                convert(gguf or locate(source), out, source)
            except BaseError as e:
                raise LaunchError(str(e)) from None
        return out
    if kind == "embedded" and "overrides" not in plan.base:  # the shipped base, as it is (the seeds6 plan)
        return ROOT / "embedded/base"
    if kind == "embedded":  # built by embedded.build with its own base report (the H200 plan)
        out = work / "base"
        cmd = [sys.executable, "-m", "embedded.build", "--out", str(out), "--snapshot", str(work / "synthetic.tasks.json"),
               "--overrides", str(ROOT / plan.base["overrides"]), "--report-cap", str(plan.recipe_dict()["max_completion_length"]),
               "--eval-problems", str(plan.base.get("eval_problems", 300))]  # fmt: skip
        budget_s = plan.base.get("budget_s", 540)  # inside the device's 10-minute call, so the log comes back
        work.mkdir(parents=True, exist_ok=True)
        with (work / "base.log").open("w") as log:
            try:
                code = subprocess.run(
                    cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=budget_s
                ).returncode
            except subprocess.TimeoutExpired:
                code = f"stopped after {budget_s} s"
        if code:
            raise LaunchError(f"the base build failed ({code}); see {work / 'base.log'}")
        return out
    raise PlanError(f"{plan.path}: base.kind {kind!r} is neither packaged nor embedded")


def prompt_text(plan: Plan, name: str) -> str:
    from data.prompt import SYSTEM_PROMPT

    text = plan.prompts.get(name)
    if text is None:
        raise PlanError(f"{plan.path}: prompts has no {name!r}")
    return {"recipe": plan.recipe_dict().get("system_prompt", SYSTEM_PROMPT), "project": SYSTEM_PROMPT}.get(
        text, text
    )


def run_base_report(plan: Plan, work: Path, smoke: bool, gguf: Path | None = None) -> dict:
    """Measure every cell, apply the rule, write base_report.{json,md}, the cells' rows and choice.json."""
    import torch

    from data.eval_sets import choose_eval_sets, heldout_pool_of
    from data.snapshot import load_snapshot
    from rewards.grader import GraderPool
    from trainer.eval_checkpoints import load_checkpoint
    from trainer.evaluation import EvalSpec, generate_eval

    grid = plan.base_report
    work.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    problems, samples, cap = (SMOKE["problems"], SMOKE["samples"], SMOKE["cap"]) if smoke else (
        grid.problems, grid.samples, grid.cap)  # fmt: skip
    caps = sorted({c for c in grid.caps if c <= cap} | {cap}) if not smoke else [cap // 2, cap]
    generation = "compiled" if device == "cuda" else "eager"
    shas = {name: write_tasks(plan, work, name) for name in {cell_tasks(c) for c in grid.cells}}
    cells, loaded, t0 = [], {}, time.perf_counter()
    with GraderPool(workers=4 if device == "cuda" else 1, timeout_s=10, memory_mb=2048) as pool:
        for cell in grid.cells:
            model_name = cell.get("model")
            if model_name not in loaded:  # one model in memory at a time
                loaded = {
                    model_name: load_checkpoint(build_base(plan, work, model_name, smoke, gguf), device)
                }
            model, tokenizer = loaded[model_name]
            tokenizer.padding_side = "left"
            tasks = {t["id"]: t for t in load_snapshot(snapshot_path(work, cell_tasks(cell)))}
            held = heldout_pool_of(tasks.values(), plan.recipe_dict().get("heldout_subject", ""))
            sets = choose_eval_sets(  # training-pool problems: whole held-out templates stay out of them too
                list(tasks), seed=0, heldout_size=min(300, len(tasks) // 4), fixed_size=32, heldout_pool=held
            )
            pool_ids = random.Random(0).sample(sorted(sets.train_pool), min(problems, len(sets.train_pool)))
            spec = EvalSpec(cap=cap, temperature=cell["temperature"], top_p=1.0, seed=1234,
                            samples={"base": samples}, batch_size=512 if device == "cuda" else 8,
                            generation=generation, system_prompt=prompt_text(plan, cell["prompt"]))  # fmt: skip
            t1 = time.perf_counter()
            rows = generate_eval(
                model, tokenizer, [tasks[i] for i in pool_ids], spec, "base", grade_fn=pool.grade_batch
            )
            name = "_".join(
                str(x) for x in (cell_tasks(cell), model_name, cell["prompt"], f"T{cell['temperature']}") if x
            )
            with (work / f"base_rows_{name}.jsonl").open("w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            cells.append(
                {
                    **cell,
                    "caps": [at_cap(rows, c) for c in caps],
                    "seconds": round(time.perf_counter() - t1, 1),
                }
            )
            print(f"{name}: {cells[-1]['caps'][-1]} ({cells[-1]['seconds']} s)", flush=True)
    choice = choose(cells, grid.rule) if grid.rule and not smoke else {
        "tasks": cell_tasks(cells[0]), "temperature": cells[0]["temperature"], "cap": cap, "fallback": False,
        "at_choice": cells[0]["caps"][-1]}  # fmt: skip
    choice["snapshot_sha256"] = shas[choice["tasks"]]
    meta = {"problems": problems, "samples": samples, "cap": cap, "generation": generation, "smoke": smoke,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "seconds": time.perf_counter() - t0}  # fmt: skip
    (work / "base_report.json").write_text(
        json.dumps({"meta": meta, "cells": cells, "choice": choice}, indent=1) + "\n"
    )
    (work / "base_report.md").write_text(report_md(plan, cells, choice, meta))
    (work / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    print((work / "base_report.md").read_text(), flush=True)
    return choice
