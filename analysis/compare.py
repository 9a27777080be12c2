"""Compare two arms (SPEC §7): paired accuracy differences, disagreements, peak and decline, plots;
one run per arm or several training seeds per arm.

    python -m analysis.compare runs/S2 runs/S0 [--a-step N] [--b-step N] [--out DIR]
    python -m analysis.compare runs/S2-s0,runs/S2-s1,runs/S2-s2 'runs/S0-s*' [--out DIR]

A and B are each a run directory, a comma-separated list of them, or a glob (quoted, so that the shell
leaves it alone). With several runs per arm, each is one training seed (run.json config.seed) and the
arms pair by seed.

Pairing. Evaluation draws sample i of problem p with the same seed at every step, in every arm and for
every training seed, so rows pair by (task_id, sample) within a seed pair. A pair with an indeterminate
sample in either arm is left out of the test and of the disagreement totals alike (and counted). A
problem's difference is the mean over its remaining pairs, over samples and seeds, of (A correct −
B correct), in percentage points; a problem with none left is dropped and counted. The problem stays the
test's unit whatever the number of samples and seeds. Accuracies use each arm's own denominator (correct
/ graded); where that differs from the paired mean, the report says so.

The comparison refuses, naming run and file, rather than pair wrongly: a missing step, different eval
sets, task ids or samples per problem, duplicate rows, eval rows that do not match their run.json, seeds
that do not pair, and recipes (run.json config) that differ in more than the seed, the arm and where the
run was written. Only training-time-cap files (eval_stepNNN.jsonl, no _capCCCC suffix) are read.
"""

import argparse
import glob
import json
import math
import re
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import numpy as np

from analysis.plots import Trajectory, plot_all
from analysis.stats import (
    EXACT_MAX,
    DeclineResult,
    SignFlipResult,
    format_p,
    holm,
    p_floor,
    peak_decline_test,
    sign_flip_test,
)
from rewards.outcome import Outcome
from rundir.files import Run, RunFileError, Sample, SetScore, Table, pct

PRIMARY_SET = "heldout300"  # SPEC §5's held-out set: the primary comparison when present

# run.json config fields that may differ between the runs of one comparison (docs/compare.md):
SEED_FIELDS = ("seed", "data_seed", "task_seed")  # the training seed and what defaults to it
ARM_FIELDS = ("arm", "groups_per_step", "problems_per_round")  # what an arm defines; A vs B only
PLACE_FIELDS = (  # where the run was written and how it reported, not what it trained
    "output_dir",
    "run_name",
    "resume",
    "resume_from_checkpoint",
    "report_to",
    "disable_tqdm",
    "log_level",
    "log_level_replica",
    "push_to_hub",
    "hub_model_id",
    "hub_token",
    "hub_private_repo",
    "hub_strategy",
    "hub_always_push",
    "hub_revision",
)


class CompareError(RunFileError):
    """The runs cannot be compared as asked; the message says which run, file, step or set."""


# --- loading and validation -----------------------------------------------------------------------
def load_run(path: str | Path) -> Run:
    """A run to compare: run.json with its eval sets, steps.jsonl, and at least one training-cap eval file.
    Rows are validated when a step is first compared (`Run.table`)."""
    run = Run(path)
    meta_path = run.dir / "run.json"
    if "eval_sets" not in run.meta:
        raise CompareError(f"{meta_path}: missing field(s) eval_sets")
    for name, ids in run.meta["eval_sets"].items():
        if name not in run.meta["eval"].get("samples", {}):
            raise CompareError(f"{meta_path}: eval.samples has no entry for eval set {name}")
        if len(set(ids)) != len(ids):
            raise CompareError(f"{meta_path}: eval_sets.{name} lists a task id more than once")
    if not (run.dir / "results" / "steps.jsonl").is_file():
        raise CompareError(f"run {run.dir}: no results/steps.jsonl")
    run.steps  # noqa: B018  (read now: a malformed steps.jsonl is refused before any statistics)
    if not run.evaluated():
        raise CompareError(f"run {run.dir}: no results/eval_stepNNN.jsonl")
    return run


def check_comparable(a: Run, b: Run) -> None:
    """Same eval sets, task ids and samples per problem in both runs, or refuse."""
    if a.sets != b.sets:
        raise CompareError(f"eval sets differ: run {a.dir} has {a.sets}, run {b.dir} has {b.sets}")
    for name in a.sets:
        ids_a, ids_b = set(a.meta["eval_sets"][name]), set(b.meta["eval_sets"][name])
        if ids_a != ids_b:
            only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
            raise CompareError(
                f"set {name}: task ids differ between runs: {len(only_a)} only in {a.dir} {only_a[:3]}, "
                f"{len(only_b)} only in {b.dir} {only_b[:3]}"
            )
        if a.samples(name) != b.samples(name):
            raise CompareError(
                f"set {name}: samples per problem differ: {a.samples(name)} in run {a.dir}, "
                f"{b.samples(name)} in run {b.dir}"
            )


# --- several runs per arm -------------------------------------------------------------------------
def expand_runs(spec) -> list[Path]:
    """Run directories from a path, a comma-separated list of paths, a glob, or a list of those."""
    paths: list[Path] = []
    for item in spec if isinstance(spec, list | tuple) else [spec]:
        for part in filter(None, (p.strip() for p in str(item).split(","))):
            if re.search(r"[*?[]", part):
                found = sorted(p for p in glob.glob(part) if (Path(p) / "run.json").is_file())
                if not found:
                    raise CompareError(f"{part!r} matches no run directory (no match holds a run.json)")
                paths += map(Path, found)
            else:
                paths.append(Path(part))
    if not paths:
        raise CompareError(f"no run directory in {spec!r}")
    seen: dict[Path, Path] = {}
    for p in paths:
        if (key := p.resolve()) in seen:
            raise CompareError(f"run {p} is listed twice ({seen[key]} and {p})")
        seen[key] = p
    return paths


@dataclass
class Side:
    """Arm A or B of a comparison: one run per training seed, compared at one step."""

    label: str  # "A" or "B"
    runs: list[Run]  # by training seed
    step: int

    @property
    def arm(self) -> str:
        return self.runs[0].arm

    @property
    def seeds(self) -> list[int | None]:
        return [r.seed for r in self.runs]

    @property
    def eval_steps(self) -> list[int]:
        return common_steps(self.runs)

    def title(self) -> str:
        k = len(self.runs)
        return f"{self.label}: {self.arm} step {self.step}" + (f" ({k} seeds)" if k > 1 else "")


def common_steps(runs: list[Run]) -> list[int]:
    """Steps evaluated in every one of the runs."""
    return sorted(set.intersection(*(set(r.evaluated()) for r in runs)))


def load_side(label: str, spec, step: int | None) -> Side:
    runs = [load_run(p) for p in expand_runs(spec)]
    arms = sorted({r.arm for r in runs})
    if len(arms) > 1:
        listing = ", ".join(f"{r.dir} ({r.arm})" for r in runs)
        raise CompareError(f"{label} mixes arms {', '.join(arms)}: {listing}")
    if len(runs) > 1:
        by_seed: dict[int, Run] = {}
        for r in runs:
            if r.seed is None:
                raise CompareError(
                    f"{r.dir / 'run.json'}: no config.seed, so the run cannot be paired by training seed"
                )
            if r.seed in by_seed:
                raise CompareError(
                    f"{label}: training seed {r.seed} appears twice: {by_seed[r.seed].dir} and {r.dir}"
                )
            by_seed[r.seed] = r
        runs = [by_seed[s] for s in sorted(by_seed)]
    if step is None:
        if not (common := common_steps(runs)):
            raise CompareError(
                f"{label}: no step is evaluated in every run ({', '.join(str(r.dir) for r in runs)})"
            )
        step = common[-1]
    for r in runs:
        r.table(step)  # validates the compared step of every run now, naming the run that lacks it
    return Side(label, runs, step)


def pair_seeds(a: Side, b: Side) -> list[tuple[Run, Run]]:
    """One run per arm pairs as is; several pair by training seed, and both arms need the same seeds."""
    if len(a.runs) == len(b.runs) == 1:
        return [(a.runs[0], b.runs[0])]
    if a.seeds != b.seeds:
        raise CompareError(
            f"A and B must hold the same training seeds (the arms pair by seed): A ({a.arm}) has "
            f"{a.seeds}, B ({b.arm}) has {b.seeds}"
        )
    return list(zip(a.runs, b.runs))


def recipe_differences(a: Side, b: Side) -> list[tuple[str, str]]:
    """(field, description) per run.json config field (or snapshot hash) in which the recipes differ beyond
    the training seed and where the run was written; arm fields may differ between A and B only."""
    found: dict[str, dict[Path, object]] = {}

    def note(ref: Run, other: Run, skip: set[str]) -> None:
        for key, (x, y) in _recipe_pairs(ref, other).items():
            if key not in skip and x != y:
                found.setdefault(key, {}).update({ref.dir: x, other.dir: y})

    skip = set(SEED_FIELDS) | set(PLACE_FIELDS)
    for side in (a, b):  # each run of an arm against the arm's first...
        for other in side.runs[1:]:
            note(side.runs[0], other, skip)
    note(a.runs[0], b.runs[0], skip | set(ARM_FIELDS))  # ...and the two first runs: covers every pair
    return [
        (key, f"{key}: " + "; ".join(f"{_short(v)} in {p}" for p, v in values.items()))
        for key, values in sorted(found.items())
    ]


def _recipe_pairs(r1: Run, r2: Run) -> dict[str, tuple]:
    c1, c2 = r1.meta.get("config") or {}, r2.meta.get("config") or {}
    pairs = {k: (c1.get(k), c2.get(k)) for k in c1.keys() | c2.keys()}
    pairs["snapshot.sha256"] = (
        (r1.meta.get("snapshot") or {}).get("sha256"),
        (r2.meta.get("snapshot") or {}).get("sha256"),
    )
    return pairs


def _short(x) -> str:
    text = json.dumps(x)
    return text if len(text) <= 60 else text[:57] + "..."


# --- statistics on eval rows ----------------------------------------------------------------------
def set_accuracy(*tables: dict[tuple[str, int], Sample]) -> SetScore:
    """Outcome counts over the rows of one eval set, summed over the tables given (e.g. one per seed)."""
    return SetScore.of(s.outcome for rows in tables for s in rows.values())


def _cell(score: SetScore) -> str:
    return f"{pct(score.accuracy)} ({score.outcomes[Outcome.CORRECT]}/{score.graded})"


Pairs = list[tuple[dict, dict]]  # (rows of A, rows of B) of one eval set, one entry per seed pair


@dataclass(frozen=True)
class PairedDiff:
    """A − B per problem, in percentage points, with the sign-flip test of its mean."""

    accuracy_a: SetScore  # own denominator: every graded sample of A (all seeds)
    accuracy_b: SetScore
    paired_a: float  # mean over the paired problems of A's correct share among the pairs kept
    paired_b: float
    n_dropped: int  # problems without a pair graded in both
    pairs: int  # sample pairs graded in both arms: what the test and the disagreement totals use
    pairs_dropped: int  # sample pairs indeterminate in A or B, left out of both
    diffs_pp: list[float]  # one per paired problem, sorted by task id
    test: SignFlipResult

    @property
    def own_diff_pp(self) -> float:
        return 100.0 * (self.accuracy_a.accuracy - self.accuracy_b.accuracy)

    @property
    def denominators_differ(self) -> bool:
        """Whether own-denominator accuracies and the paired mean tell different numbers at print precision."""
        return f"{self.own_diff_pp:+.1f}" != f"{self.test.mean_diff:+.1f}"


def paired_difference(rows_a: dict, rows_b: dict, *, n_resamples: int, seed: int) -> PairedDiff:
    """Rows of one eval set from two tables with the same keys (check_comparable / same run)."""
    return pooled_difference([(rows_a, rows_b)], n_resamples=n_resamples, seed=seed)


def pooled_difference(pairs: Pairs, *, n_resamples: int, seed: int) -> PairedDiff:
    """A − B per problem over every seed pair and sample graded in both, then the sign-flip test over
    problems: each problem's difference is the mean over its kept (seed, sample) pairs."""
    per_task: dict[str, list[tuple[int, int]]] = {}  # every problem gets an entry, so dropped ones count
    dropped = 0
    for rows_a, rows_b in pairs:
        for key, a in sorted(rows_a.items()):
            b, kept = rows_b[key], per_task.setdefault(key[0], [])
            if Outcome.INDETERMINATE in (a.outcome, b.outcome):
                dropped += 1
            else:
                kept.append((a.outcome is Outcome.CORRECT, b.outcome is Outcome.CORRECT))
    kept = [v for v in per_task.values() if v]
    if not kept:
        raise CompareError("no problem has a sample graded in both (every pair has an indeterminate)")
    diffs = [100.0 * sum(x - y for x, y in v) / len(v) for v in kept]
    test = sign_flip_test(diffs, n_resamples=n_resamples, seed=seed)
    return PairedDiff(
        accuracy_a=set_accuracy(*(a for a, _ in pairs)),
        accuracy_b=set_accuracy(*(b for _, b in pairs)),
        paired_a=float(np.mean([sum(x for x, _ in v) / len(v) for v in kept])),
        paired_b=float(np.mean([sum(y for _, y in v) / len(v) for v in kept])),
        n_dropped=len(per_task) - len(kept),
        pairs=sum(map(len, kept)),
        pairs_dropped=dropped,
        diffs_pp=diffs,
        test=test,
    )


def disagreements(rows_a: dict, rows_b: dict) -> Counter:
    """Counter of (outcome in B, outcome in A) over the sample pairs graded in both arms (the pairs the
    test uses) where the two differ."""
    return Counter(
        (b.outcome, a.outcome)
        for k, a in rows_a.items()
        if a.outcome is not (b := rows_b[k]).outcome and Outcome.INDETERMINATE not in (a.outcome, b.outcome)
    )


@dataclass(frozen=True)
class SeedSpread:
    """The arm difference seed by seed: how much it moves with the training seed."""

    seeds: list[int | None]
    diffs_pp: list[float]  # paired mean A − B per seed

    @property
    def mean(self) -> float:
        return statistics.fmean(self.diffs_pp)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.diffs_pp) if len(self.diffs_pp) > 1 else math.nan

    @property
    def a_ahead(self) -> int:
        return sum(d > 0 for d in self.diffs_pp)


@dataclass(frozen=True)
class PeakDecline:
    peak_step: int
    step: int  # the compared step
    steps: list[int]  # the evaluated steps the peak was chosen from (every seed has them)
    change: PairedDiff  # compared step − peak step, paired by problem and sample within each run
    test: DeclineResult  # selection-aware: the peak re-selected in every permutation

    @property
    def decline_pp(self) -> float:
        """Own-denominator accuracy at the compared step − at the peak (<= 0): the tested statistic."""
        return -100.0 * self.test.decline if self.test.decline else 0.0  # never "-0.0"


def peak_decline(
    runs: "Run | list[Run]", name: str, step: int, *, n_resamples: int, seed: int
) -> PeakDecline:
    """Best-accuracy step at or before `step` (earliest of ties; accuracy pooled over the runs, one per
    seed) and the selection-aware test of the decline from it to `step`."""
    runs = [runs] if isinstance(runs, Run) else list(runs)
    for r in runs:
        r.table(step)  # refuses, naming the run, when the step was not evaluated
    steps = [s for s in common_steps(runs) if s <= step]
    index = {t: i for i, t in enumerate(runs[0].meta["eval_sets"][name])}
    correct, graded = np.zeros((len(index), len(steps))), np.zeros((len(index), len(steps)))
    for r in runs:
        for j, s in enumerate(steps):
            for (task, _), x in r.table(s)[name].items():
                if x.outcome is not Outcome.INDETERMINATE:
                    graded[index[task], j] += 1
                    correct[index[task], j] += x.outcome is Outcome.CORRECT
    test = peak_decline_test(correct, graded, n_resamples=n_resamples, seed=seed)
    peak = steps[test.peak]
    try:
        change = pooled_difference(
            [(r.table(step)[name], r.table(peak)[name]) for r in runs], n_resamples=n_resamples, seed=seed
        )
    except CompareError as e:
        where = ", ".join(str(r.dir) for r in runs)
        raise CompareError(f"run {where}, set {name}, steps {peak} and {step}: {e}") from None
    return PeakDecline(peak, step, steps, change, test)


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


# --- the comparison -------------------------------------------------------------------------------
@dataclass
class Comparison:
    a: Side
    b: Side
    primary: str  # the eval set of the primary comparison, named before looking
    paired: dict[str, PairedDiff]  # per eval set, pooled over the seed pairs; the primary set first
    per_seed: list[tuple[int | None, dict[str, PairedDiff]]]  # per seed pair (training seed, per set)
    disagreements: dict[str, Counter]  # per set, over every seed pair: (outcome in B, outcome in A)
    peaks: dict[str, dict[str, PeakDecline]]  # "A" / "B" -> eval set -> peak and decline
    warnings: list[str]
    report: Path
    plots: dict[str, Path]

    # the single-run form's names
    @property
    def run_a(self) -> Run:
        return self.a.runs[0]

    @property
    def run_b(self) -> Run:
        return self.b.runs[0]

    @property
    def step_a(self) -> int:
        return self.a.step

    @property
    def step_b(self) -> int:
        return self.b.step

    @property
    def n_seeds(self) -> int:
        return len(self.per_seed)

    def family(self) -> list[tuple[str, float, str, int, int]]:
        """The report's tests, the primary first: (name, p, method, resamples, tails); Holm runs over these."""
        tests = [
            (f"A − B, {n}", d.test.p_value, d.test.method, d.test.n_resamples, 2)
            for n, d in self.paired.items()
        ]
        for side in (self.a, self.b):
            for n, pd in self.peaks[side.label].items():
                t = pd.test
                tests.append(
                    (f"decline, {side.label} ({side.arm}), {n}", t.p_value, t.method, t.n_resamples, 1)
                )
        return tests

    def holm_cells(self) -> dict[str, str]:
        """Holm-adjusted p per test of family(), printed; "< x" where the value rests on a Monte Carlo floor."""
        fam = self.family()
        ps = [p for _, p, *_ in fam]
        adjusted, cells = holm(ps), {}
        running, source = 0.0, None
        for rank, i in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
            if min(1.0, (len(ps) - rank) * ps[i]) > running or source is None:
                running, source = min(1.0, (len(ps) - rank) * ps[i]), i
            _, p, method, m, tails = fam[source]
            at_floor = (floor := p_floor(method, m, tails)) is not None and p <= floor * (1 + 1e-9)
            if at_floor and adjusted[i] < 1:
                cells[fam[i][0]] = f"< {adjusted[i]:.1g}"
            else:  # as many digits as the p-value it rests on carries
                cells[fam[i][0]] = f"{adjusted[i]:.4g}" if method == "exact" else f"{adjusted[i]:.2g}"
        return cells

    def spread(self) -> dict[str, SeedSpread]:
        seeds = [s for s, _ in self.per_seed]
        return {n: SeedSpread(seeds, [d[n].test.mean_diff for _, d in self.per_seed]) for n in self.paired}

    def headline(self) -> str:
        holm_p = self.holm_cells()
        rows = [
            [
                f"{name} (primary)" if name == self.primary else name,
                _cell(d.accuracy_a),
                _cell(d.accuracy_b),
                f"{d.test.mean_diff:+.1f}",
                f"{d.test.n} ({d.test.n_nonzero})",
                _p(d.test),
                holm_p[f"A − B, {name}"],
                d.test.describe(),
            ]
            for name, d in self.paired.items()
        ]
        heads = [
            "set",
            self.a.title(),
            self.b.title(),
            "A − B paired (pp)",
            "problems (non-zero)",
            "p (two-sided)",
            f"p Holm ({len(holm_p)} tests)",
            "sign-flip test",
        ]
        return _table(heads, rows)

    def headline_notes(self) -> list[str]:
        """Where own-denominator accuracies and the paired mean differ, and what was left out."""
        notes = []
        for name, d in self.paired.items():
            if d.denominators_differ:
                notes.append(
                    f"**{name}**: the accuracies above use each arm's own denominator and differ by "
                    f"{d.own_diff_pp:+.1f} pp; the paired difference uses the {d.pairs} sample pairs graded in "
                    f"both arms ({d.test.n} problems), where A is {pct(d.paired_a)} and B {pct(d.paired_b)}: "
                    f"{d.test.mean_diff:+.1f} pp."
                )
            if d.pairs_dropped or d.n_dropped:
                notes.append(
                    f"**{name}**: {d.pairs_dropped} sample pair(s) indeterminate in A or B left out of the test "
                    f"and of the disagreement totals; {d.n_dropped} problem(s) had no pair left."
                )
        return notes


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
) -> Comparison:
    """Compare arm A with arm B; writes report.md and PNG plots into out_dir (default
    comparisons/<armA>_vs_<armB>/). run_a / run_b: a run directory, a comma-separated list, a glob, or a
    list of those (one run per training seed). Steps default to the last step every run of the arm evaluated."""
    a, b = load_side("A", run_a, step_a), load_side("B", run_b, step_b)
    ref = a.runs[0]
    for r in [*a.runs[1:], *b.runs]:
        check_comparable(ref, r)
    notes = _recipe_check(a, b, allow_recipe)
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
        warnings=_same_run(a, b)
        + notes
        + _warnings(seed_pairs, a.step, b.step)
        + _seed_warnings(a)
        + _seed_warnings(b),
        report=out / "report.md",
        plots=plot_all(out, [trajectory(a), trajectory(b)], sets),
    )
    result.report.write_text(render_report(result, seed))
    return result


def _recipe_check(a: Side, b: Side, allow: tuple[str, ...]) -> list[str]:
    """Refuse recipes that differ beyond seed, arm and place; allowed fields become warnings."""
    notes = [
        f"{r.dir / 'run.json'} has no config: its recipe could not be compared with the others'"
        for r in [*a.runs, *b.runs]
        if not r.meta.get("config")
    ]
    diffs = recipe_differences(a, b)
    refused = [text for key, text in diffs if key not in allow]
    if refused:
        raise CompareError(
            "the runs' recipes (run.json config) differ in more than the training seed, the arm and where "
            "they were written:\n  " + "\n  ".join(refused) + "\n(pass --allow-recipe-difference FIELD to "
            "compare anyway)"
        )
    return notes + [f"recipes differ (allowed): {text}" for _, text in diffs]


def _same_run(a: Side, b: Side) -> list[str]:
    notes = []
    for ra in a.runs:
        for rb in b.runs:
            if ra.dir.resolve() != rb.dir.resolve():
                continue
            if a.step == b.step:
                notes.append(
                    f"A and B are the same run ({ra.dir}) at the same step {a.step}: every difference is "
                    "zero by construction and p = 1 says nothing about the arms"
                )
            else:
                notes.append(
                    f"A and B are the same run ({ra.dir}), at steps {a.step} and {b.step}: this compares two "
                    "steps of one run, not two arms"
                )
    return notes


def _warnings(seed_pairs: list[tuple[Run, Run]], step_a: int, step_b: int) -> list[str]:
    """Differences that do not break the pairing but limit what the comparison says."""
    notes = []
    for a, b in seed_pairs:
        ta, tb = a.table(step_a), b.table(step_b)
        pair = f" (seed {a.seed})" if len(seed_pairs) > 1 else ""
        if a.meta["grader_version"] != b.meta["grader_version"]:
            notes.append(
                f"grader versions differ{pair}: {a.meta['grader_version']} (A) vs {b.meta['grader_version']} (B)"
            )
        if _caps(ta) != _caps(tb):
            notes.append(f"evaluation caps differ{pair}: {_caps(ta)} (A) vs {_caps(tb)} (B)")
        for key in ("temperature", "top_p"):
            if a.meta["eval"].get(key) != b.meta["eval"].get(key):
                notes.append(
                    f"eval {key} differs{pair}: {a.meta['eval'].get(key)} (A) vs {b.meta['eval'].get(key)} (B)"
                )
        n = sum(ta[s][k].seed != tb[s][k].seed for s in ta for k in ta[s])
        if n:
            notes.append(
                f"{n} samples were drawn with different seeds in A and B{pair}: pairs share problem, not seed"
            )
    return notes


def _seed_warnings(side: Side) -> list[str]:
    """The seeds of one arm should have drawn every eval sample with the same seed."""
    first = side.runs[0].table(side.step)
    notes = []
    for r in side.runs[1:]:
        t = r.table(side.step)
        n = sum(first[s][k].seed != t[s][k].seed for s in first for k in first[s])
        if n:
            notes.append(
                f"{side.label}: {n} eval samples of {r.dir} were drawn with other seeds than in {side.runs[0].dir}"
            )
    return notes


def _caps(table: Table) -> str:
    return ", ".join(str(c) for c in sorted({s.cap for rows in table.values() for s in rows.values()}))


# --- report.md ------------------------------------------------------------------------------------
def render_report(c: Comparison, seed: int) -> str:
    a, b, k = c.a, c.b, c.n_seeds
    seeds = f", {k} training seeds per arm" if k > 1 else ""
    out = [f"# Arm comparison: A = {a.arm} (step {a.step}) vs B = {b.arm} (step {b.step}){seeds}", ""]
    out += [f"> **Warning:** {w}" for w in c.warnings] + ([""] if c.warnings else [])
    out += ["## What was compared", "", _table(["", "A", "B"], _setup_rows(c)), ""]
    out += [
        "## Paired difference A − B",
        "",
        f"**Primary comparison: {c.primary}, A at step {a.step} against B at step {b.step}** "
        + (
            "(the held-out set at the chosen steps, fixed before looking). "
            if c.primary == PRIMARY_SET
            else f"(named as primary; the runs have no {PRIMARY_SET} set or another was asked for). "
        )
        + "Every other p-value in this report is secondary. "
        f"Holm-adjusted p-values control the family-wise error over the {len(c.family())} tests of this report "
        "(A − B per set, decline per arm and set); the raw p-values stand beside them.",
        "",
        c.headline(),
        "",
    ]
    out += [f"- {n}" for n in c.headline_notes()] + ([""] if c.headline_notes() else [])
    pooled = (
        f" and its {k} training seeds (each seed's A run against the B run of the same seed: "
        f"{', '.join(map(str, a.seeds))})"
        if k > 1
        else ""
    )
    shapes = ", ".join(f"{n}: {a.runs[0].samples(n)} per problem" for n in c.paired)
    out += [
        f"One pair per problem: the mean over its samples{pooled} of (A correct − B correct), in percentage "
        f"points ({shapes}); the problem is the unit of the test. Sample pairs that are indeterminate in either "
        "arm leave the pair; the accuracy columns are each arm's own correct / graded.",
        "",
    ]
    if k > 1:
        out += _seed_sections(c)
    out += ["## Where the arms disagree", ""]
    for name, counts in c.disagreements.items():
        d = c.paired[name]
        gains = sum(v for (ob, oa), v in counts.items() if oa is Outcome.CORRECT)
        losses = sum(v for (ob, oa), v in counts.items() if ob is Outcome.CORRECT)
        out += [
            f"**{name}**: over the {d.pairs} sample pairs graded in both arms (the pairs the test uses; "
            f"{d.pairs_dropped} with an indeterminate left out), {sum(counts.values())} differ; "
            f"A correct where B is not: {gains}; B correct where A is not: {losses}.",
            "",
            _table(
                ["outcome in B → outcome in A", "samples"],
                [
                    [f"B {ob} → A {oa}", str(v)]
                    for (ob, oa), v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                ],
            ),
            "",
        ]
    out += ["## Peak and decline", "", _peak_table(c), ""]
    out += [
        "Peak: the most accurate evaluated step up to the compared step (own-denominator accuracy"
        + (", pooled over the seeds" if k > 1 else "")
        + "; the earliest of ties). The change is compared step − peak step. The test is one-sided "
        "(a decline) and selection-aware: under the null hypothesis that the evaluated steps do not differ, each "
        "problem's results are exchangeable across steps, so every Monte Carlo permutation shuffles each "
        "problem's step labels, picks its own peak by the same rule and records its decline; p is the share "
        "at least as large as the observed one, (b + 1) / (m + 1). A test of the observed peak as if it had been "
        "chosen in advance would reject too often (more evaluations, more chances of a high peak). "
        "The paired change is the same change over the sample pairs graded at both steps.",
        "",
        "## Accuracy per eval step",
        "",
    ]
    for side in (a, b):
        for run in side.runs:
            tag = f", seed {run.seed}" if k > 1 else ""
            out += [f"**{side.label}: {run.arm}{tag}** (`{run.dir}`)", "", _accuracy_table(run), ""]
    out += ["## Trajectories", ""]
    if k > 1:
        out += [f"Lines: the mean over the {k} seeds; bands: the lowest to the highest seed.", ""]
    out += [f"### {title}\n\n![{title}]({path.name})\n" for title, path in c.plots.items()]
    out += [
        "## About the tests",
        "",
        "A − B: two-sided paired sign-flip permutation test of the mean per-problem difference. Under the null "
        "hypothesis the two members of each pair are exchangeable, so each difference is equally likely to "
        f"have either sign. Exact when at most {EXACT_MAX} differences are non-zero (all 2^k sign patterns); "
        f"otherwise Monte Carlo over m random sign patterns (seed {seed}) with p = (b + 1) / (m + 1) per tail, "
        'so the smallest Monte Carlo p is 2 / (m + 1), printed as "< 2 / (m + 1) (Monte Carlo floor)" '
        "because the true p is then only bounded. Two-sided p = 2 × min(lower tail, upper tail), capped at 1; "
        "zero differences count in n and the mean. These are the conventions of "
        "`scipy.stats.permutation_test(permutation_type='samples')`.",
        "",
        _seed_scope(c),
        "",
    ]
    return "\n".join(out)


def _seed_scope(c: Comparison) -> str:
    if c.n_seeds == 1:
        return (
            "Each arm is a single training run: the tests cover evaluation sampling given the two checkpoints, "
            "not the variance between training seeds."
        )
    return (
        f"Each arm has {c.n_seeds} training seeds. The pooled test keeps the problem as its unit (the eval sets "
        "and eval seeds are the same for every run) and averages each problem over samples and seeds, so it "
        "covers evaluation sampling and these seeds' training noise as it shows up per problem; it does not "
        "treat the seeds as a sample of all seeds. The seed-to-seed spread above shows how far one seed's "
        "difference can stray from the pooled one."
    )


def _seed_sections(c: Comparison) -> list[str]:
    rows = []
    for s, per_set in c.per_seed:
        for name, d in per_set.items():
            rows.append(
                [
                    str(s),
                    name,
                    _cell(d.accuracy_a),
                    _cell(d.accuracy_b),
                    f"{d.test.mean_diff:+.1f}",
                    f"{d.test.n} ({d.test.n_nonzero})",
                    _p(d.test),
                    d.test.describe(),
                ]
            )
    heads = ["seed", "set", "A accuracy", "B accuracy", "A − B paired (pp)", "problems (non-zero)"]
    spread = [
        [
            name,
            f"{sp.mean:+.1f}",
            f"{sp.sd:.1f}",
            f"{min(sp.diffs_pp):+.1f} to {max(sp.diffs_pp):+.1f}",
            f"{sp.a_ahead} of {len(sp.diffs_pp)}",
            f"{c.paired[name].test.mean_diff:+.1f}",
        ]
        for name, sp in c.spread().items()
    ]
    return [
        "## Per seed",
        "",
        "Each training seed's A run against the B run of the same seed, paired as above. Raw p-values, one "
        "seed at a time: detail behind the pooled result, not findings of their own (not in the Holm family).",
        "",
        _table([*heads, "p (two-sided, raw)", "sign-flip test"], rows),
        "",
        "## Seed-to-seed spread of A − B",
        "",
        _table(
            [
                "set",
                "mean of seeds (pp)",
                "SD over seeds (pp)",
                "range (pp)",
                "seeds with A ahead",
                "pooled (pp)",
            ],
            spread,
        ),
        "",
    ]


def _setup_rows(c: Comparison) -> list[list[str]]:
    sides = (c.a, c.b)
    tables = [r.table(side.step) for side in sides for r in side.runs[:1]]

    def row(title: str, fn) -> list[str]:
        return [title, *("<br>".join(sorted({str(fn(r)) for r in side.runs})) for side in sides)]

    return [
        ["run directory", *("<br>".join(f"`{r.dir.resolve()}`" for r in side.runs) for side in sides)],
        row("arm", lambda r: r.arm),
        ["training seeds", *(", ".join(map(str, side.seeds)) for side in sides)],
        row("policy", lambda r: f"`{r.meta['policy_id']}`"),
        row("gate", lambda r: r.meta["gate"]),
        row("groups per step", lambda r: r.meta.get("groups_per_step", "?")),
        ["compared step", *(str(side.step) for side in sides)],
        ["evaluated steps (every seed)", *(", ".join(map(str, side.eval_steps)) for side in sides)],
        row("grader version", lambda r: f"`{r.meta['grader_version']}`"),
        ["eval cap (tokens)", *(_caps(t) for t in tables)],
        row("samples per problem", lambda r: _kv({n: r.samples(n) for n in r.sets})),
        row("problems", lambda r: _kv({n: len(r.meta["eval_sets"][n]) for n in r.sets})),
        row("eval temperature / top_p / seed", lambda r: _eval_sampling(r.meta["eval"])),
        row("base model", lambda r: f"`{r.meta.get('base_model', '?')}`"),
    ]


def _eval_sampling(ev: dict) -> str:
    return " / ".join(str(ev.get(k, "?")) for k in ("temperature", "top_p", "seed"))


def _peak_table(c: Comparison) -> str:
    holm_p, rows = c.holm_cells(), []
    for side in (c.a, c.b):
        for name, pd in c.peaks[side.label].items():
            acc, t = pd.test.accuracy, pd.test
            rows.append(
                [
                    f"{side.label}: {side.arm}",
                    name,
                    f"{pd.peak_step} ({pct(acc[t.peak])})",
                    f"{pd.step} ({pct(acc[-1])})",
                    f"{pd.decline_pp:+.1f}",
                    f"{pd.change.test.mean_diff:+.1f} ({pd.change.test.n})",
                    format_p(t.p_value, t.method, t.n_resamples, tails=1),
                    holm_p[f"decline, {side.label} ({side.arm}), {name}"],
                    t.describe() if t.decline > 0 else "no decline: the compared step is the peak",
                ]
            )
    heads = [
        "arm",
        "set",
        "peak step (acc.)",
        "compared step (acc.)",
        "change (pp)",
        "paired change (problems)",
    ]
    return _table([*heads, "p (one-sided)", "p Holm", "test"], rows)


def _accuracy_table(run: Run) -> str:
    rows = []
    for step in run.evaluated():
        accs = [set_accuracy(run.table(step)[n]) for n in run.sets]
        rows.append(
            [str(step), *(x for acc in accs for x in (_cell(acc), str(acc.outcomes[Outcome.INDETERMINATE])))]
        )
    return _table(["step", *(h for n in run.sets for h in (f"{n} accuracy", f"{n} indeterminate"))], rows)


def _table(heads: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _kv(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def _p(t: SignFlipResult) -> str:
    return format_p(t.p_value, t.method, t.n_resamples)


# --- CLI ------------------------------------------------------------------------------------------
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
    args = parser.parse_args(argv)
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
        )
    except RunFileError as e:  # CompareError, or a run file that breaks the contract
        print(f"compare refused: {e}", file=sys.stderr)
        return 2
    print(c.headline())
    for note in c.headline_notes():
        print(f"- {note}")
    if c.n_seeds > 1:
        for name, sp in c.spread().items():
            print(
                f"{name}: per-seed A − B {', '.join(f'{d:+.1f}' for d in sp.diffs_pp)} pp "
                f"(seeds {', '.join(map(str, sp.seeds))}; SD {sp.sd:.1f} pp)"
            )
    for w in c.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"\nreport: {c.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
