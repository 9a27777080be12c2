"""pass@j, maj@k and their bootstrap intervals against brute-force enumeration on small cases."""

import itertools

import numpy as np
import pytest

from rundir.at_k import (
    at_k,
    bootstrap_interval,
    ladder,
    majority,
    pass_at,
    per_problem,
    problem_scores,
)

C, W, T, F, N = "correct", "wrong", "truncated", "format_rejected", "indeterminate"


def brute_pass(correct: list[bool], j: int) -> float:
    """Share of the j-subsets of the samples that hold a correct one."""
    subsets = list(itertools.combinations(correct, j))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_equals_enumeration(n):
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for j in range(1, n + 1):
            assert pass_at(n, c, j) == pytest.approx(brute_pass(correct, j), abs=1e-12)


def test_pass_at_refuses_more_draws_than_samples():
    with pytest.raises(ValueError, match="pass@3"):
        pass_at(2, 1, 3)


def test_ladder():
    assert (
        ladder(8) == [1, 2, 4, 8] and ladder(6) == [1, 2, 4, 6] and ladder(2) == [1, 2] and ladder(1) == [1]
    )


def brute_majority(votes: list[tuple[str, bool]]) -> float:
    """The tie rule by enumeration: every ordering of the votes, the first-seen most-voted answer wins."""
    if not votes:
        return 0.0
    wins = []
    for order in itertools.permutations(votes):
        counts = {}
        for a, _ in order:
            counts[a] = counts.get(a, 0) + 1
        top = max(counts.values())
        winner = next(a for a in counts if counts[a] == top)  # dict order: first seen in this ordering
        wins.append(next(ok for a, ok in votes if a == winner))
    return sum(wins) / len(wins)


@pytest.mark.parametrize(
    "votes",
    [
        [],
        [("3", True)],
        [("3", True), ("4", False)],
        [("3", True), ("4", False), ("4", False)],
        [("3", True), ("3", True), ("4", False), ("4", False), ("5", False)],
        [("1", False), ("2", False), ("3", True), ("4", False)],
    ],
)
def test_majority_tie_rule_equals_uniform_pick(votes):
    assert majority(votes) == pytest.approx(brute_majority(votes))


def rows(task: str, outcomes: str, answers: str) -> list[dict]:
    code = {"C": C, "W": W, "T": T, "F": F, "N": N}
    return [{"task_id": task, "outcome": code[o], "answer": a} for o, a in zip(outcomes, answers)]


def test_unresolved_answers_never_vote():
    """p0: truncated and format-rejected rows all answer 9; were they to vote, 9 would win. They don't, so the
    completed 7 (correct) and 8 tie: 0.5. p1: an indeterminate row is not a sample (n = 3, c = 1), k = 3."""
    scores = problem_scores(per_problem(rows("p0", "CWTTF", "78999") + rows("p1", "NCWW", "x566")))
    assert list(scores) == ["pass@1", "pass@2", "pass@3", "maj@3"]
    assert scores["maj@3"] == [0.5, 0.0]
    assert scores["pass@1"] == pytest.approx([1 / 5, 1 / 3])
    assert scores["pass@3"] == pytest.approx([1 - 4 / 10, 1.0])


def test_one_sample_per_problem_gives_nothing():
    assert at_k(rows("p0", "C", "1") + rows("p1", "W", "2")) == {}


def test_bootstrap_matches_the_exact_resampling_distribution():
    """Three problems: all 27 resamples enumerated; the seeded Monte Carlo quantiles land on their values."""
    scores = [0.0, 0.5, 1.0]
    means = sorted(np.mean(c) for c in itertools.product(scores, repeat=3))
    lo, hi = bootstrap_interval(scores, n_resamples=200_000, seed=3)
    assert means[0] <= lo <= means[1] + 1e-12 and means[-2] - 1e-12 <= hi <= means[-1]
    assert bootstrap_interval(scores, seed=3) == bootstrap_interval(scores, seed=3)
    assert bootstrap_interval([0.25] * 5) == (0.25, 0.25)


def test_at_k_values():
    r = rows("a", "CCWW", "1122") + rows("b", "WWWW", "3333") + rows("c", "CWWT", "5669")
    est = at_k(r, n_resamples=2000)
    # pass@1: (2/4 + 0 + 1/4)/3; pass@2: (1 − 1/6 + 0 + 1 − 3/6)/3; pass@4: (1 + 0 + 1)/3.
    assert est["pass@1"].value == pytest.approx(0.25)
    assert est["pass@2"].value == pytest.approx((5 / 6 + 0.5) / 3)
    assert est["pass@4"].value == pytest.approx(2 / 3)
    # maj: a ties 1 (correct) and 2 → 0.5; b 0; c: 6 wins (wrong), the truncated 9 does not vote → 0.
    assert est["maj@4"].value == pytest.approx(0.5 / 3)
    for e in est.values():
        assert e.low <= e.value <= e.high
