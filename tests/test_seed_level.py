"""The seed-level test (the training run as the unit): its false-positive rate measured on simulated null
runs, its vectorised form against analysis.stats, and the power line against the simulated power."""

import math

import numpy as np
import pytest

from analysis.seed_null import null_runs, rejection_rates
from analysis.stats import ALPHA, min_seeds, seeds_for_power, sign_flip_rows, sign_flip_test

SIMS = 4000  # s.e. of a 5% rate: 0.34 pp, so 5% and 8% are ~9 s.e. apart


def test_vectorised_sign_flip_is_sign_flip_test_row_by_row():
    runs = null_runs(6, 3.0, problems=300, sims=40)
    for row, p in zip(runs.per_seed_pp, sign_flip_rows(runs.per_seed_pp)):
        assert p == pytest.approx(sign_flip_test(row).p_value, abs=1e-12)


@pytest.mark.parametrize("seed_sd", [0.0, 1.5, 3.0])
@pytest.mark.parametrize("n_seeds", [6, 8])
def test_seed_level_false_positive_rate_is_at_most_alpha(n_seeds, seed_sd, capsys):
    seed_rate, problem_rate = rejection_rates(n_seeds, seed_sd, problems=300, sims=SIMS)
    with capsys.disabled():
        print(f"\n{n_seeds} seeds, seed SD {seed_sd} pp, no arm effect: seed-level p <= 0.05 in {seed_rate:.1%}, "
              f"problem-level {problem_rate:.1%}")  # fmt: skip
    se = math.sqrt(ALPHA * (1 - ALPHA) / SIMS)
    assert seed_rate <= ALPHA + 2.5 * se  # an 8% rate would fail by ~6 s.e.
    # exact but discrete: 6 seeds can only reject at p = 1/32 (3.1%), 8 seeds at p <= 6/128 (4.7%)
    attainable = math.floor(ALPHA * 2 ** (n_seeds - 1)) / 2 ** (n_seeds - 1)
    assert seed_rate >= attainable - 4 * math.sqrt(attainable * (1 - attainable) / SIMS)
    if seed_sd == 3.0:  # what the seed-level test is for: the problem-level one is about the checkpoints
        assert problem_rate > ALPHA + 4 * se


@pytest.mark.parametrize(("sd", "effect"), [(2.7, 3.4), (3.0, 3.0), (2.0, 4.0), (3.0, 2.61)])
def test_seeds_for_power_gives_about_80_percent_power_to_the_exact_sign_flip(sd, effect):
    n = seeds_for_power(sd, effect)
    assert n >= min_seeds() == 6
    rng = np.random.default_rng(int(sd * 10 + effect * 100))  # not the seed seeds_for_power draws with
    sims = 3000
    power = float((sign_flip_rows(rng.normal(effect, sd, (sims, n))) <= ALPHA).mean())
    se = math.sqrt(0.8 * 0.2 / sims)
    assert power >= 0.8 - 3 * se
    if n > min_seeds():  # not wastefully many: one seed fewer falls short of 80% (or close to it)
        fewer = float((sign_flip_rows(rng.normal(effect, sd, (sims, n - 1))) <= ALPHA).mean())
        assert fewer < 0.8 + 3 * se


def test_seeds_for_power_edge_cases():
    assert seeds_for_power(0.0, 3.0) == 6  # no spread: the fewest seeds that can reach p <= 0.05
    assert seeds_for_power(2.0, 0.0) is None and seeds_for_power(float("nan"), 3.0) is None
    assert seeds_for_power(3.0, -3.0) == seeds_for_power(3.0, 3.0)  # the sign does not matter
    assert seeds_for_power(2.7, 3.0) > seeds_for_power(2.7, 3.4)
