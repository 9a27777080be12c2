"""The run's card (`README.md`): the seed card's sections (summary, Recipe, Results, Limits, Files) for one run,
with the paired comparison against a control run when there is one."""

import logging
import os
from collections import Counter
from pathlib import Path

from huggingface_hub import ModelCard

from analysis.stats import format_p
from cards import metadata
from rundir.at_k import at_k
from rundir.files import Run, pct, step_name

logger = logging.getLogger(__name__)

CONTROL_KEY = "capgrpo_control"  # run-card metadata: the control run, relative to the run dir
N_RESAMPLES = 100_000  # Monte Carlo sign patterns, as `make compare` uses by default


# --- run card ---------------------------------------------------------------------------------------
def _comparison(run: Run, control: Path | str) -> dict:
    """This run's last evaluated step against the control's, with `make compare`'s paired statistics."""
    from analysis import compare  # imported here: it loads matplotlib, and most cards have no control

    a, b = compare.load_run(run.dir), compare.load_run(control)
    compare.check_comparable(a, b)
    step_a, step_b = a.evaluated()[-1], b.evaluated()[-1]
    ta, tb = a.table(step_a), b.table(step_b)
    tests = []
    # the held-out set leads, as in the seed card
    for name in sorted(a.sets, key=lambda n: n != run.rank_set):
        d = compare.paired_difference(ta[name], tb[name], n_resamples=N_RESAMPLES, seed=0)
        tests.append(
            {
                "set": name,
                "diff": f"{d.test.mean_diff:+.1f} pp",
                "p": format_p(d.test.p_value, d.test.method, d.test.n_resamples),
                "n": d.test.n,
            }
        )
    counts = compare.disagreements(ta[run.rank_set], tb[run.rank_set]) if run.rank_set in ta else Counter()
    disagree = [f"{ob} → {oa}: {n}" for (ob, oa), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {
        "arm": b.arm,
        "seed": b.seed,
        "dir": os.path.relpath(b.dir, run.dir),
        "step_a": step_a,
        "step_b": step_b,
        "tests": tests,
        "disagree": disagree,
    }


def _trajectory(run: Run) -> dict:
    logp = [r["logprob_median"] for r in run.steps if r.get("logprob_median") is not None]
    gate = [(r["step"], r["gate_stat"]) for r in run.steps if r.get("gate_stat") is not None]
    evals = run.evaluated()
    lengths = [
        (s, sc.median_tokens) for s in evals if (sc := run.score(s, run.rank_set)) and sc.median_tokens
    ]
    return {
        "logprob": [f"{x:.3f}" for x in (logp[0], logp[-1], min(logp), max(logp))] if logp else None,
        "length": [(s, f"{n:g}") for s, n in (lengths[0], lengths[-1])] if len(lengths) > 1 else None,
        "gate_last": (gate[-1][0], pct(gate[-1][1])) if gate else None,
        "bound_hits": sum(bool((r.get("groups") or {}).get("bound_hit")) for r in run.steps),
    }


def _at_k(run: Run) -> list[str]:
    """pass@j / maj@k with their intervals at the last evaluated step, per set with ≥ 2 samples per problem."""
    if not (evals := run.evaluated()):
        return []
    rows = [r for _, r in run.rows(evals[-1])]
    out = []
    for name in sorted({r["set"] for r in rows}):
        est = at_k(r for r in rows if r["set"] == name)
        parts = [f"{m} {pct(e.value)} [{pct(e.low)}, {pct(e.high)}]" for m, e in est.items()]
        if parts:
            out.append(f"{name} at step {evals[-1]}: " + ", ".join(parts))
    return out


def _decline(run: Run) -> dict | None:
    """The rank set's peak evaluated step against the last one, paired by problem (as `make compare` does)."""
    if len([s for s in run.evaluated() if run.score(s, run.rank_set)]) < 2:
        return None
    from analysis import compare

    r = compare.load_run(run.dir)
    pd = compare.peak_decline(r, run.rank_set, r.evaluated()[-1], n_resamples=N_RESAMPLES, seed=0)
    if pd.peak_step == pd.step:
        return {"peak": pd.peak_step, "last": pd.step, "diff": None}
    t = pd.change.test
    return {
        "peak": pd.peak_step,
        "last": pd.step,
        "diff": f"{t.mean_diff:+.1f} pp",
        "p": format_p(
            pd.test.p_value, pd.test.method, pd.test.n_resamples, tails=1
        ),  # selection-aware: the peak was chosen after looking
        "n": t.n,
    }


def run_card(
    run_dir: Path | str, control: Path | str | None = None, *, repo_id: str | None = None
) -> ModelCard:
    """The run's README.md: the seed card's sections (summary, Recipe, Results, Limits, Files) for this run."""
    return build_run_card(Run(run_dir), control, repo_id)


def recorded_control(run_dir: Path | str) -> Path | None:
    """The control the existing run card was made with, so that regenerating it (after a save, before a push)
    keeps the comparison; None when there is none or that run directory is gone."""
    readme = Path(run_dir) / "README.md"
    if not readme.is_file():
        return None
    rel = ModelCard.load(readme, ignore_metadata_errors=True).data.to_dict().get(CONTROL_KEY)
    if rel is None:
        return None
    if not (Path(run_dir) / rel / "run.json").is_file():
        logger.warning("%s: its control run %s is gone; the run card drops the comparison", readme, rel)
        return None
    return Path(os.path.normpath(Path(run_dir) / rel))


def build_run_card(run: Run, control: Path | str | None, repo_id: str | None) -> ModelCard:
    control = control if control is not None else recorded_control(run.dir)
    ranking = run.ranking()
    best = ranking[0][0] if ranking else None
    evals = run.evaluated()
    table_sets = sorted({n for k in run.scores.values() for n in k})
    table = [
        {
            "step": s,
            "cap": c,
            "cells": [pct(sc.accuracy) if (sc := run.score(s, n, c)) else "" for n in table_sets],
        }
        for s, c in sorted(run.scores)
    ]
    model_name = f"capgrpo-{run.arm}"
    remembered = {CONTROL_KEY: os.path.relpath(control, run.dir)} if control is not None else {}
    return metadata.render(
        "run.md.j2",
        metadata.card_data(run, model_name, best, **remembered),
        **metadata.common_context(run),
        model_name=model_name,
        snapshot=run.meta.get("snapshot", {}),
        callbacks=run.meta.get("callbacks", []),  # the recipe's, as train.py resolved them
        set_shapes=[
            f"{n} × {k} sample{'s' * (k != 1)}"
            for n, k in sorted(run.meta["eval"].get("samples", {}).items())
        ],
        table_sets=table_sets,
        table=table,
        evaluated=[step_name(s) for s in evals],
        saved=[step_name(s) for s in run.saved],
        best=None if best is None else {"dir": step_name(best), "accuracy": pct(ranking[0][1])},
        last_saved=step_name(run.saved[-1]) if run.saved else None,
        architecture=run.architecture(run.saved[-1]) if run.saved else run.meta.get("architecture", "?"),
        versus=_comparison(run, control) if control is not None else None,
        decline=_decline(run),
        at_k=_at_k(run),
        trajectory=_trajectory(run),
        repo_id=repo_id,
        rank_set=run.rank_set,
    )


def write_run_card(
    run_dir: Path | str, control: Path | str | None = None, *, repo_id: str | None = None
) -> Path:
    path = Path(run_dir) / "README.md"
    metadata.save_card(run_card(run_dir, control, repo_id=repo_id), path)
    return path
