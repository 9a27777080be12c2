"""Compare two arms (SPEC §7): with several training seeds per arm, the headline test's unit is the
training run; the problem-level test holds given these checkpoints. Writes report.md and PNG plots.

    python -m analysis.compare runs/S2 runs/S0 [--a-step N] [--b-step N] [--out DIR]
    python -m analysis.compare 'runs/S2-s*' 'runs/S0-s*' --a-step 30 --b-step 30 --out DIR

A and B are each a run directory, a comma-separated list of them, or a glob (quoted, so that the shell
leaves it alone); analysis.pairing says how runs pair and what is refused, analysis.differences what the
statistics are, analysis.report how they are written. Only training-time-cap files (eval_stepNNN.jsonl,
no _capCCCC suffix) are read.
"""

import argparse
import math
import sys
from collections import Counter
from pathlib import Path
from statistics import median

import numpy as np

from analysis.comparison import AtK, Comparison
from analysis.differences import (  # noqa: F401  (paired_difference, disagreements: the run card's too)
    PairedDiff,
    Pairs,
    PeakDecline,
    SeedLevel,
    disagreements,
    paired_difference,
    peak_decline,
    pooled_difference,
    seed_level,
    set_accuracy,
)
from analysis.pairing import (  # noqa: F401  (load_run, check_comparable: the run card's entry points)
    CompareError,
    Side,
    check_comparable,
    load_run,
    load_side,
    pair_seeds,
    pairing_warnings,
    recipe_check,
    same_run_warnings,
    seed_warnings,
)
from analysis.plots import Trajectory, plot_all
from analysis.report import headline, headline_notes, render_report, seed_headline
from analysis.stats import SMALLEST_EFFECT_PP, sign_flip_test
from data.atomic import refused_write
from data.eval_sets import HELDOUT
from rewards.outcome import Outcome
from rundir.at_k import Estimate, bootstrap_interval, per_problem, problem_scores
from rundir.files import Run, RunFileError

PRIMARY_SET = HELDOUT  # SPEC §5's held-out set: the primary comparison when present


def compare_runs(
    run_a,
    run_b,
    out_dir: str | Path | None = None,
    *,
    step_a: int | None = None,
    step_b: int | None = None,
    n_resamples: int = 100_000,
    seed: int = 0,
    primary: str | None = None,
    allow_recipe: tuple[str, ...] = (),
    smallest_effect_pp: float = SMALLEST_EFFECT_PP,
) -> Comparison:
    """Compare arm A with arm B; writes report.md and PNG plots into out_dir (default
    comparisons/<armA>_vs_<armB>/). run_a / run_b: a run directory, a comma-separated list, a glob, or a
    list of those (one run per training seed). Steps default to the last step every run of the arm evaluated."""
    a, b = load_side("A", run_a, step_a), load_side("B", run_b, step_b)
    ref = a.runs[0]
    for r in [*a.runs[1:], *b.runs]:
        check_comparable(ref, r)
    notes = recipe_check(a, b, allow_recipe)
    seed_pairs = pair_seeds(a, b)
    sets = ref.sets
    primary = primary or (PRIMARY_SET if PRIMARY_SET in sets else sets[0])
    if primary not in sets:
        raise CompareError(f"primary set {primary!r} is not an eval set of these runs ({', '.join(sets)})")
    sets = [primary, *(n for n in sets if n != primary)]
    kw = {"n_resamples": n_resamples, "seed": seed}

    def pairs_of(name: str, chosen: list[tuple[Run, Run]]) -> Pairs:
        return [(ra.table(a.step)[name], rb.table(b.step)[name]) for ra, rb in chosen]

    def diff(name: str, chosen: list[tuple[Run, Run]]) -> PairedDiff:
        try:
            return pooled_difference(pairs_of(name, chosen), **kw)
        except CompareError as e:
            where = "; ".join(f"{ra.dir} step {a.step} vs {rb.dir} step {b.step}" for ra, rb in chosen)
            raise CompareError(f"set {name}, {where}: {e}") from None

    paired = {name: diff(name, seed_pairs) for name in sets}
    per_seed = [(ra.seed, {name: diff(name, [(ra, rb)]) for name in sets}) for ra, rb in seed_pairs]
    seeds = [s for s, _ in per_seed]
    by_seed = {name: seed_level(seeds, [d[name] for _, d in per_seed]) for name in sets}
    disagree = {
        name: sum((disagreements(x, y) for x, y in pairs_of(name, seed_pairs)), Counter()) for name in sets
    }
    peaks = {
        side.label: {name: peak_decline(side.runs, name, side.step, **kw) for name in sets} for side in (a, b)
    }
    out = Path(out_dir) if out_dir is not None else Path("comparisons") / f"{a.arm}_vs_{b.arm}"
    out.mkdir(parents=True, exist_ok=True)
    result = Comparison(
        a=a,
        b=b,
        primary=primary,
        paired=paired,
        per_seed=per_seed,
        disagreements=disagree,
        peaks=peaks,
        warnings=same_run_warnings(a, b)
        + notes
        + pairing_warnings(seed_pairs, a.step, b.step)
        + seed_warnings(a)
        + seed_warnings(b),
        report=out / "report.md",
        plots=plot_all(out, [trajectory(a), trajectory(b)], sets),
        smallest_effect_pp=smallest_effect_pp,
        seed_level=by_seed if len(per_seed) > 1 else {},
        at_k={name: rows for name in sets if (rows := at_k_pairs(a, b, seed_pairs, name, **kw))},
    )
    result.report.write_text(render_report(result, seed))
    return result


def at_k_pairs(a: Side, b: Side, seed_pairs, name: str, *, n_resamples: int, seed: int) -> list[AtK]:
    """pass@j / maj@k of one set for both arms; the unit is a problem of a seed pair, in the same order."""

    def scores(run: Run, step: int) -> dict[str, list[float]]:
        return problem_scores(per_problem(r for _, r in run.rows(step) if r["set"] == name))

    per_pair = [(scores(ra, a.step), scores(rb, b.step)) for ra, rb in seed_pairs]
    metrics = [m for m in per_pair[0][0] if all(m in sa and m in sb for sa, sb in per_pair)]
    out = []
    for m in metrics:
        xa = np.array([x for sa, _ in per_pair for x in sa[m]])
        xb = np.array([x for _, sb in per_pair for x in sb[m]])
        est = [Estimate(float(x.mean()), *bootstrap_interval(x, seed=seed)) for x in (xa, xb)]
        out.append(AtK(m, *est, sign_flip_test(xa - xb, n_resamples=n_resamples, seed=seed)))
    return out


def trajectory(side: Side) -> Trajectory:
    """Per-seed series of one arm, on the eval steps every seed has and the union of training steps."""
    evals = side.eval_steps
    train_steps = sorted({row["step"] for r in side.runs for row in r.steps})

    def per_eval(fn) -> dict[str, list[list[float]]]:
        return {n: [[fn(r.table(s)[n]) for s in evals] for r in side.runs] for n in side.runs[0].sets}

    return Trajectory(
        label=f"{side.label}: {side.arm}",
        compared_step=side.step,
        eval_steps=evals,
        accuracy=per_eval(lambda rows: set_accuracy(rows).accuracy),
        median_tokens=per_eval(lambda rows: median(x.tokens for x in rows.values())),
        truncated=per_eval(lambda rows: set_accuracy(rows).rate(Outcome.TRUNCATED)),
        format_rejected=per_eval(lambda rows: set_accuracy(rows).rate(Outcome.FORMAT_REJECTED)),
        train_steps=train_steps,
        logprob_median=[_step_series(r, "logprob_median", train_steps) for r in side.runs],
        logprob_mean=[_step_series(r, "logprob_mean", train_steps, optional=True) for r in side.runs],
        gate_stat=[_step_series(r, "gate_stat", train_steps) for r in side.runs],
    )


def _step_series(run: Run, key: str, steps: list[int], optional: bool = False) -> list[float]:
    """One value per training step in `steps`; a logged null or a step without a row becomes NaN (and so does
    a missing `optional` field: logprob_mean is newer than some runs)."""
    by_step = {}
    for row in run.steps:
        if key not in row and optional:
            continue
        if key not in row:
            raise CompareError(f"{run.dir / 'results/steps.jsonl'}: step {row['step']} has no '{key}'")
        by_step[row["step"]] = math.nan if row[key] is None else float(row[key])
    return [by_step.get(s, math.nan) for s in steps]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.compare",
        description="Compare two arms' runs with paired statistics (SPEC §7).",
    )
    parser.add_argument(
        "run_a",
        help="arm A: a run directory (runs/S2), a comma-separated list, or a quoted glob ('runs/S2-s*')",
    )
    parser.add_argument("run_b", help="arm B, in the same forms (runs/S0)")
    parser.add_argument("--a-step", type=int, help="evaluated step of A (default: the last every A run has)")
    parser.add_argument("--b-step", type=int, help="evaluated step of B (default: the last every B run has)")
    parser.add_argument("--out", type=Path, help="output folder (default: comparisons/<armA>_vs_<armB>/)")
    parser.add_argument(
        "--resamples",
        type=int,
        default=100_000,
        help="Monte Carlo sign patterns / permutations (default 100000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    parser.add_argument(
        "--primary", help=f"eval set of the primary comparison (default: {PRIMARY_SET} when present)"
    )
    parser.add_argument(
        "--allow-recipe-difference",
        action="append",
        default=[],
        metavar="FIELD",
        help="a run.json config field allowed to differ between the runs (repeatable; reported as a warning)",
    )
    parser.add_argument(
        "--smallest-effect",
        type=float,
        default=SMALLEST_EFFECT_PP,
        metavar="PP",
        help=f"smallest A − B of interest, in pp, for the power line (default {SMALLEST_EFFECT_PP})",
    )
    args = parser.parse_args(argv)
    if args.smallest_effect <= 0:
        parser.error("--smallest-effect must be positive")
    if args.resamples < 1:
        parser.error("--resamples must be at least 1")
    try:
        c = compare_runs(
            args.run_a,
            args.run_b,
            args.out,
            step_a=args.a_step,
            step_b=args.b_step,
            n_resamples=args.resamples,
            seed=args.seed,
            primary=args.primary,
            allow_recipe=tuple(args.allow_recipe_difference),
            smallest_effect_pp=args.smallest_effect,
        )
    except RunFileError as e:  # CompareError, or a run file that breaks the contract
        print(f"compare refused: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if (refused := refused_write(e)) is None:
            raise
        print(f"compare refused: {refused}", file=sys.stderr)  # a read-only --out folder
        return 2
    print(seed_headline(c) + "\n\nProblem-level test, given these checkpoints:\n\n" + headline(c))
    for note in headline_notes(c):
        print(f"- {note}")
    for w in c.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"\nreport: {c.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
