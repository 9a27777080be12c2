"""pass@j and maj@k of an eval set with several samples per problem, each with a bootstrap interval over
problems (issue 47).

pass@j is Chen et al. 2021's unbiased estimator, 1 − C(n−c, j)/C(n, j) per problem (n graded samples, c
correct), averaged over problems, for j = 1, 2, 4, …, k (k the fewest graded samples of any problem, itself
last). maj@k: a majority vote over the `answer` of a problem's completed rows (correct or wrong); truncated,
format-rejected and indeterminate rows never vote. Tie rule: a tie between answers scores the share of the
tied answers that are correct (the expected score of a uniform pick among them); no vote scores 0.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from rewards.outcome import Outcome

VOTING = (Outcome.CORRECT, Outcome.WRONG)
N_BOOTSTRAP = 10_000
LEVEL = 0.95


def pass_at(n: int, c: int, j: int) -> float:
    """Probability that j of n samples drawn without replacement include one of the c correct ones."""
    if not 0 <= c <= n or not 1 <= j <= n:
        raise ValueError(f"pass@{j} needs 1 ≤ j ≤ n and 0 ≤ c ≤ n (n={n}, c={c})")
    return 1.0 - math.comb(n - c, j) / math.comb(n, j)


def majority(votes: Iterable[tuple[str, bool]]) -> float:
    """maj score of one problem from (answer, correct) of its voting rows; the tie rule is the module's."""
    count, right = Counter(), defaultdict(list)
    for answer, correct in votes:
        count[answer] += 1
        right[answer].append(correct)
    if not count:
        return 0.0
    top = max(count.values())
    tied = [a for a, v in count.items() if v == top]
    return sum(sum(right[a]) / len(right[a]) for a in tied) / len(tied)


def ladder(k: int) -> list[int]:
    """1, 2, 4, … below k, then k."""
    js = [1 << i for i in range(k.bit_length()) if 1 << i < k]
    return [*js, k] if k >= 1 else []


def bootstrap_interval(scores, *, n_resamples: int = N_BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """Percentile interval (LEVEL) of the mean over problems, problems resampled with replacement, seeded."""
    x = np.asarray(scores, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_resamples, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def as_json(self) -> dict:
        return {"value": self.value, "ci": [self.low, self.high], "level": LEVEL}


def per_problem(rows: Iterable[Mapping]) -> dict[str, list[tuple[Outcome, str | None]]]:
    """task_id -> [(outcome, answer)] of one eval set's rows."""
    out = defaultdict(list)
    for r in rows:
        out[r["task_id"]].append((Outcome(r["outcome"]), r.get("answer")))
    return dict(out)


def problem_scores(problems: Mapping[str, list[tuple[Outcome, str | None]]]) -> dict[str, list[float]]:
    """Per metric (pass@j …, maj@k), the per-problem scores in task order; {} when a problem has < 2 graded."""
    graded = {
        t: [(o, a) for o, a in s if o is not Outcome.INDETERMINATE] for t, s in sorted(problems.items())
    }
    k = min((len(s) for s in graded.values()), default=0)
    if k < 2:
        return {}
    scores = {}
    for j in ladder(k):
        scores[f"pass@{j}"] = [
            pass_at(len(s), sum(o is Outcome.CORRECT for o, _ in s), j) for s in graded.values()
        ]
    if any(a is None for s in graded.values() for o, a in s if o in VOTING):
        return scores  # rows without their answer: no vote
    scores[f"maj@{k}"] = [
        majority((a, o is Outcome.CORRECT) for o, a in s if o in VOTING) for s in graded.values()
    ]
    return scores


def at_k(rows: Iterable[Mapping], *, n_resamples: int = N_BOOTSTRAP, seed: int = 0) -> dict[str, Estimate]:
    """pass@j and maj@k of one eval set's rows, each with its bootstrap interval; {} with one sample each."""
    out = {}
    for name, s in problem_scores(per_problem(rows)).items():
        out[name] = Estimate(float(np.mean(s)), *bootstrap_interval(s, n_resamples=n_resamples, seed=seed))
    return out
