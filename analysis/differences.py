"""Paired statistics on the eval rows of two arms (SPEC §7): A − B per problem pooled over samples and
seeds, the same per seed pair with the training run as the unit, the disagreements, and peak and decline.

Pairing. Evaluation draws sample i of problem p with the same seed at every step, in every arm and for
every training seed, so rows pair by (task_id, sample) within a seed pair. A pair with an indeterminate
sample in either arm is left out of the test and of the disagreement totals alike (and counted). A
problem's difference is the mean over its remaining pairs, over samples and seeds, of (A correct −
B correct), in percentage points; a problem with none left is dropped and counted. Accuracies use each
arm's own denominator (correct / graded); where that differs from the paired mean, the report says so.
"""

import math
import statistics
from collections import Counter
from dataclasses import dataclass

import numpy as np

from analysis.pairing import CompareError, common_steps
from analysis.stats import (
    ALPHA,
    POWER,
    SMALLEST_EFFECT_PP,
    DeclineResult,
    SignFlipResult,
    peak_decline_test,
    seeds_for_power,
    sign_flip_test,
)
from rewards.outcome import Outcome
from rundir.files import Run, Sample, SetScore


def set_accuracy(*tables: dict[tuple[str, int], Sample]) -> SetScore:
    """Outcome counts over the rows of one eval set, summed over the tables given (e.g. one per seed)."""
    return SetScore.of(s.outcome for rows in tables for s in rows.values())


Pairs = list[tuple[dict, dict]]  # (rows of A, rows of B) of one eval set, one entry per seed pair


@dataclass(frozen=True)
class PairedDiff:
    """A − B per problem, in percentage points, with the sign-flip test of its mean."""

    accuracy_a: SetScore  # own denominator: every graded sample of A (all seeds)
    accuracy_b: SetScore
    paired_a: float  # mean over the paired problems of A's correct share among the problem's pairs kept
    paired_b: float
    pair_share_a: float  # A's correct share over the kept sample pairs themselves (all problems together)
    pair_share_b: float
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
        pair_share_a=sum(x for v in kept for x, _ in v) / sum(map(len, kept)),
        pair_share_b=sum(y for v in kept for _, y in v) / sum(map(len, kept)),
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
class SeedLevel:
    """A − B with the training run as the unit: one paired mean per seed pair (each seed's A run against
    the B run of the same seed, the mean over problems of the per-problem differences), and the exact
    two-sided sign-flip test over the seed pairs. Valid whatever the seed-to-seed spread: under the null,
    a seed pair's A and B runs are exchangeable, so each seed's difference is as likely to have either sign."""

    seeds: list[int | None]
    diffs_pp: list[float]
    test: SignFlipResult

    @property
    def mean(self) -> float:
        return statistics.fmean(self.diffs_pp)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.diffs_pp) if len(self.diffs_pp) > 1 else math.nan

    @property
    def a_ahead(self) -> int:
        return sum(d > 0 for d in self.diffs_pp)

    def seeds_needed(self, effect_pp: float) -> int | None:
        """Seeds per arm for POWER at a true difference of effect_pp, planned on the observed SD."""
        return seeds_for_power(self.sd, effect_pp)

    def power_line(self, smallest_pp: float = SMALLEST_EFFECT_PP) -> str:
        def need(effect: float) -> str:
            n = self.seeds_needed(effect)
            return "undefined (no difference)" if n is None else f"{n}"

        return (
            f"seeds per arm for {POWER:.0%} power (two-sided α = {ALPHA}), planned on the observed SD over seeds "
            f"{self.sd:.1f} pp: {need(self.mean)} at the observed {self.mean:+.1f} pp, {need(smallest_pp)} at "
            f"the smallest effect of interest {smallest_pp:.1f} pp ({len(self.diffs_pp)} were run)"
        )


def seed_level(seeds: list[int | None], per_seed: list[PairedDiff]) -> SeedLevel:
    diffs = [d.test.mean_diff for d in per_seed]
    return SeedLevel(seeds, diffs, sign_flip_test(diffs))


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
