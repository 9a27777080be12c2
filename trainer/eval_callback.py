"""Evaluation during training (SPEC §5): `EvalCallback` evaluates at step 0, every `eval_every` steps and at the
last step, on a bf16-rounded copy of the training model (what a checkpoint stores, so `make eval` on stepNNN/
reproduces its rows); step 0 may copy another run's rows of the same base instead (`shared_step0_rows`).
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from accelerate import PartialState
from tqdm.auto import tqdm
from transformers import TrainerCallback

from engine import sharding
from rundir.files import eval_path, read_jsonl, summarize, write_eval  # the run's files live there
from rundir.run_json import RunDirError, read_run_json
from trainer.evaluation import (
    EvalSpec,
    GradeFn,
    as_checkpoint,
    compute_dtype,
    log_metrics,
    run_eval,
    sample_seed,
)

# --- step 0 ---------------------------------------------------------------------------------------
# what must match for another run's step-0 rows to be this run's: the same base, tasks, sets, eval settings
# and grader (the launcher starts every run of a plan from one base and recipe; this says so per run)
STEP0_SAME = ("base_model", "architecture", "snapshot", "eval_sets", "eval", "extra_evals", "grader_version")


def shared_step0_rows(source: Path, run_dir: Path, tasks_by_set: Mapping[str, Sequence[Mapping]],
                      spec: EvalSpec) -> list[dict]:  # fmt: skip
    """The rows of another run's `results/eval_step000.jsonl` (`step0_eval_from`), checked to be the ones this
    run would write: its run.json agrees on STEP0_SAME, and its rows are this run's (set, task, sample, seed, cap)
    in order. Step 0 evaluates the base, which every run of a launch shares, with seeds that depend on the task
    and sample alone, so generating them again per run only repeats the same rows (issue 60)."""
    source = Path(source)
    theirs, ours = read_run_json(source.parent.parent), read_run_json(run_dir)
    differ = [k for k in STEP0_SAME if theirs.get(k) != ours.get(k)]
    if (device := theirs.get("launch", {}).get("device")) != ours.get("launch", {}).get("device"):
        differ.append(f"device ({device} there)")  # another GPU model's kernels may give other rows
    if differ:
        raise RunDirError(f"step0_eval_from {source}: its run differs from this one in {', '.join(differ)}")
    rows = read_jsonl(source)
    want = [(name, task_id, i, sample_seed(spec.seed, task_id, i), spec.cap, 0)
            for name in sorted(tasks_by_set) for task_id in sorted(t["id"] for t in tasks_by_set[name])
            for i in range(spec.samples[name])]  # fmt: skip
    got = [
        (r.get("set"), r.get("task_id"), r.get("sample"), r.get("seed"), r.get("cap"), r.get("step"))
        for r in rows
    ]
    if got != want:
        bad = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        raise RunDirError(f"step0_eval_from {source}: row {bad + 1} is not this run's step-0 sample "
                          f"({len(got)} rows, {len(want)} expected)")  # fmt: skip
    return rows


class EvalCallback(TrainerCallback):
    """Evaluates at step 0 (not when resuming), every `eval_every` steps (or at `eval_steps` alone: the config's
    eval_at_steps) and at the last step. With `step0_rows` (another run's step-0 file) step 0 copies those rows
    instead of generating. At `extra_steps` it also evaluates `extra`, {cap: {set: tasks}} (the config's
    extra_evals): at the spec's cap those rows join the step's file, at another cap they get a file of their own.

    After each evaluation: `last_step`, `last_summary` (steps.jsonl's `eval` object), `last_seconds`;
    `log_fn` (e.g. `trainer.log`) gets the flat `log_metrics`. Only the main process generates, with the
    weights as a checkpoint stores them (an FSDP2-sharded model is gathered into a whole bf16 copy first).
    `llm_fn`, when given, returns a vLLM engine already holding the current weights.
    """

    def __init__(
        self,
        run_dir,
        tasks_by_set: Mapping[str, Sequence[Mapping]],
        spec: EvalSpec,
        eval_every: int,
        tokenizer,
        *,
        log_fn: Callable[[dict], None] | None = None,
        grade_fn: GradeFn | None = None,
        llm_fn: Callable[[], object] | None = None,
        eval_steps: Sequence[int] = (),
        step0_rows: str | Path | None = None,
        extra: Mapping[int, Mapping[str, Sequence[Mapping]]] | None = None,
        extra_steps: Sequence[int] = (),
    ):
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}")
        extra = extra or {}
        unknown = sorted({*tasks_by_set, *(s for sets in extra.values() for s in sets)} - set(spec.samples))
        if unknown:
            raise ValueError(f"eval sets {unknown} have no sample count in the eval spec")
        self.run_dir, self.tasks_by_set, self.spec = Path(run_dir), tasks_by_set, spec
        self.eval_every, self.tokenizer = eval_every, tokenizer
        self.log_fn, self.grade_fn, self.llm_fn = log_fn, grade_fn, llm_fn
        self.last_step: int | None = None
        self.last_summary: dict | None = None
        self.last_seconds = 0.0
        self.eval_steps, self.step0_rows = frozenset(eval_steps), step0_rows
        self.extra, self.extra_steps = extra, frozenset(extra_steps)
        self.weights = None  # the rounded copy every evaluation reuses (refreshed_weights)

    def due(self, step: int, max_steps: int) -> bool:
        return step == max_steps or (
            step in self.eval_steps if self.eval_steps else step % self.eval_every == 0
        )

    def sets_at(self, step: int) -> list[tuple[int, dict]]:
        """[(cap, {set: tasks})] evaluated at `step`, the run's own cap last (its file is the step's summary)."""
        by_cap = {self.spec.cap: dict(self.tasks_by_set)}
        if step in self.extra_steps:
            for cap, sets in self.extra.items():
                by_cap.setdefault(cap, {}).update(sets)
        return sorted(by_cap.items(), key=lambda item: item[0] == self.spec.cap)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0 and self.due(0, state.max_steps):
            if self.step0_rows is None:
                self.evaluate(model, 0)
            else:
                self.copy_step0()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.due(state.global_step, state.max_steps):
            self.evaluate(model, state.global_step)

    def copy_step0(self) -> None:
        start = time.perf_counter()
        dist = PartialState()
        if dist.is_main_process:
            source_run = Path(self.step0_rows).parent.parent
            for cap, sets in self.sets_at(0):
                own = cap == self.spec.cap
                source = Path(self.step0_rows) if own else eval_path(source_run, 0, cap)
                rows = shared_step0_rows(source, self.run_dir, sets, replace(self.spec, cap=cap))
                write_eval(self.run_dir, 0, rows, None if own else cap, overwrite=True)
            self.last_summary = summarize(rows)
            tqdm.write(f"step 0: {len(rows)} rows copied from {self.step0_rows}", file=sys.stderr)
            if self.log_fn is not None:
                self.log_fn(log_metrics(self.last_summary))
        dist.wait_for_everyone()
        self.last_step, self.last_seconds = 0, time.perf_counter() - start

    def evaluate(self, model, step: int) -> None:
        start = time.perf_counter()
        dist = PartialState()
        weights = None
        if sharding.is_sharded(model):  # FSDP2: every process gathers, the main one evaluates a whole copy
            full = sharding.full_parameters(model)
            if dist.is_main_process:
                weights = as_checkpoint(sharding.unsharded_copy(model, full, torch.bfloat16))
        elif dist.is_main_process:
            weights = self.weights = refreshed_weights(self.weights, model)
        if dist.is_main_process:
            by_cap = self.sets_at(step)
            n = sum(
                len(tasks) * self.spec.samples[name] for _, sets in by_cap for name, tasks in sets.items()
            )
            # its own phase on the console: the progress bar counts optimizer steps and stands still meanwhile
            tqdm.write(f"evaluating step {step}: {n} samples", file=sys.stderr)
            llm = self.llm_fn() if self.llm_fn is not None else None
            for cap, sets in by_cap:
                spec, own = replace(self.spec, cap=cap), cap == self.spec.cap
                rows = run_eval(weights, self.tokenizer, sets, spec, step, llm=llm, grade_fn=self.grade_fn)
                # a resumed run redoing this step supersedes what the interrupted run wrote
                write_eval(self.run_dir, step, rows, None if own else cap, overwrite=True)
            self.last_summary = summarize(rows)
            accuracy = ", ".join(
                f"{name} {v['accuracy']:.3f}"
                for name, v in self.last_summary.items()
                if v["accuracy"] is not None
            )
            tqdm.write(
                f"step {step} evaluated in {time.perf_counter() - start:.1f} s: {accuracy}", file=sys.stderr
            )
            if self.log_fn is not None:
                self.log_fn(log_metrics(self.last_summary))
        dist.wait_for_everyone()
        self.last_step = step
        self.last_seconds = time.perf_counter() - start


# --- the evaluation copy --------------------------------------------------------------------------
def checkpoint_weights(model):
    """The model as a checkpoint stores it (bf16 values), so `make eval` on stepNNN/ reproduces in-training
    rows. A bf16 model on a GPU is used as is; anything else is evaluated through a rounded copy."""
    if model is None or model.dtype == compute_dtype(model.device) == torch.bfloat16:
        return model
    rounded = copy.deepcopy(model)
    # deepcopy shares functions: transformers' compiled decode call (`get_compiled_call`), made by the rollouts,
    # would still run the training model's weights after this copy's prefill; the copy compiles its own
    for name in ("_compiled_call", "_last_compile_config"):
        rounded.__dict__.pop(name, None)
    return as_checkpoint(rounded)


def refreshed_weights(copy_, model):
    """`checkpoint_weights(model)` reusing `copy_` (an earlier evaluation's copy of the same model): its tensors
    take the new bf16 values in place, so its compiled decode call and CUDA graphs (which hold their addresses)
    run again instead of a new copy compiling its own and leaving the old one's graph memory behind (+2.5 GiB a
    evaluation on the 0.5B in docs/experiment-qwen's launch 1)."""
    if copy_ is None or model is None or model.dtype == compute_dtype(model.device) == torch.bfloat16:
        return checkpoint_weights(model)
    with torch.no_grad():
        for mine, theirs in zip(copy_.parameters(), model.parameters(), strict=True):
            mine.copy_(theirs.detach().to(torch.bfloat16))
    return copy_
