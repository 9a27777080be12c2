"""The sign-flip test against scipy's paired permutation test, and on cases small enough to count by hand."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import permutation_test

from analysis.stats import ceil_sig, fixed_sequence_holm, format_p, holm, peak_decline_test, sign_flip_test


def scipy_p(x, y, n_resamples=np.inf, rng=0) -> float:
    """scipy's two-sided paired permutation test of mean(x − y); exact when 2^n <= n_resamples."""
    res = permutation_test(
        (x, y),
        lambda a, b, axis: np.mean(a - b, axis=axis),
        permutation_type="samples",
        alternative="two-sided",
        n_resamples=n_resamples,
        vectorized=True,
        rng=rng,
    )
    return float(res.pvalue)


def paired_samples(rng, n: int, shift: float, n_ties: int = 0, lattice: bool = False):
    """Pairs (x, y) with mean shift; the first n_ties pairs equal (zero differences); lattice: 0/1 outcomes."""
    if lattice:
        x, y = rng.integers(0, 2, n).astype(float), (rng.random(n) < 0.5 - shift).astype(float)
    else:
        x = rng.normal(size=n)
        y = x - rng.normal(shift, 1.0, size=n)
    y[:n_ties] = x[:n_ties]
    return x, y


@pytest.mark.parametrize("seed", range(8))
def test_exact_matches_scipy_exact(seed):
    rng = np.random.default_rng(seed)
    for lattice in (False, True):
        n = int(rng.integers(2, 13))
        x, y = paired_samples(rng, n, shift=0.4, n_ties=int(rng.integers(0, 3)), lattice=lattice)
        res = sign_flip_test(x - y)
        assert res.method == "exact"
        assert res.n == n and res.n_nonzero == int(np.count_nonzero(x - y))
        assert res.n_resamples == 2**res.n_nonzero
        assert res.mean_diff == pytest.approx(np.mean(x - y))
        assert res.p_value == pytest.approx(scipy_p(x, y), abs=1e-12)


def test_monte_carlo_matches_scipy_monte_carlo():
    rng = np.random.default_rng(11)
    for shift in (0.2, 0.45):
        x, y = paired_samples(rng, 40, shift, n_ties=5)  # 2^40 patterns: both sides must sample
        res = sign_flip_test(x - y, n_resamples=20_000, seed=3)
        assert res.method == "monte_carlo" and res.n_resamples == 20_000
        ref = scipy_p(x, y, n_resamples=20_000, rng=5)
        # Two independent estimates of p, each with s.e. about 2 * sqrt(q (1 - q) / m), q the tail share.
        q = ref / 2
        se = 2 * math.sqrt(q * (1 - q) / 20_000)
        assert abs(res.p_value - ref) < 5 * math.sqrt(2) * se + 1e-4


def test_monte_carlo_agrees_with_exact_and_scipy_exact():
    rng = np.random.default_rng(7)
    x, y = paired_samples(rng, 16, 0.5, n_ties=2)
    exact = sign_flip_test(x - y)
    mc = sign_flip_test(x - y, n_resamples=50_000, seed=1, exact_max=0)
    assert exact.method == "exact" and mc.method == "monte_carlo"
    assert exact.p_value == pytest.approx(scipy_p(x, y), abs=1e-12)
    q = exact.p_value / 2
    assert abs(mc.p_value - exact.p_value) < 5 * 2 * math.sqrt(q * (1 - q) / 50_000) + 1e-4


def test_monte_carlo_is_seeded():
    d = np.random.default_rng(2).normal(0.3, 1, 30)
    assert sign_flip_test(d, seed=4, n_resamples=5000) == sign_flip_test(d, seed=4, n_resamples=5000)
    assert sign_flip_test(d, seed=4, n_resamples=5000) != sign_flip_test(d, seed=5, n_resamples=5000)


def test_extreme_data_hand_counted():
    # All differences positive: only the all-plus pattern reaches the observed mean.
    exact = sign_flip_test(np.arange(1.0, 11.0))
    assert exact.p_value == 2 / 2**10
    # On the lattice: exact at any number of non-zero differences.
    lattice = sign_flip_test(np.ones(30))
    assert (lattice.method, lattice.lattice, lattice.p_value) == ("exact", True, 2 / 2**30)
    # Monte Carlo: a random pattern is all-plus with probability 2^-30, so b = 0 and p = 2 / (m + 1).
    mc = sign_flip_test(np.ones(30), n_resamples=999, lattice=False)
    assert mc.method == "monte_carlo" and mc.p_value == 2 / 1000


def test_small_case_hand_counted():
    # Non-zero differences +1, +1, +1, −1 (sum 2): of 16 patterns, sum 4 once and sum 2 four times.
    res = sign_flip_test([1, 1, 0, 1, -1, 0])
    assert (res.n, res.n_nonzero, res.n_resamples) == (6, 4, 16)
    assert res.mean_diff == pytest.approx(2 / 6)
    assert res.p_value == pytest.approx(2 * 5 / 16)


def test_zero_differences_change_n_and_mean_not_p():
    d = np.array([0.5, -1.5, 2.0, 1.0, 0.25])
    with_zeros = sign_flip_test(np.concatenate([d, np.zeros(4)]))
    assert with_zeros.p_value == sign_flip_test(d).p_value
    assert (with_zeros.n, with_zeros.n_nonzero) == (9, 5)
    assert with_zeros.mean_diff == pytest.approx(d.sum() / 9)


def test_all_zero_differences():
    res = sign_flip_test(np.zeros(5))
    assert (res.p_value, res.n_nonzero, res.mean_diff, res.method) == (1.0, 0, 0.0, "exact")


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [[1.0, 2.0]]])
def test_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="sign_flip_test"):
        sign_flip_test(bad)


# --- multiplicity and printing ------------------------------------------------------------------------
def test_holm_hand_worked():
    # Sorted: 0.005 × 4 = 0.02, 0.01 × 3 = 0.03, 0.03 × 2 = 0.06, 0.04 × 1 = 0.04 → raised to 0.06 (monotone).
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # 0.5 × 2 = 1, and the next cannot be smaller
    assert holm([0.2]) == [0.2]


def test_p_values_print_exact_or_as_a_monte_carlo_bound():
    assert format_p(2 / 100_001, "monte_carlo", 100_000) == "≤ 2e-05 (0 of 100,000 draws as extreme)"
    assert format_p(1 / 1001, "monte_carlo", 1000, tails=1) == "≤ 0.001 (0 of 1,000 draws as extreme)"
    # issue 28: 2 / 60,001 = 3.33e-05 printed "< 3e-05"; rounded up it is 3.4e-05
    assert format_p(2 / 60_001, "monte_carlo", 60_000) == "≤ 3.4e-05 (0 of 60,000 draws as extreme)"
    assert format_p(8 / 100_001, "monte_carlo", 100_000) == "≤ 8e-05 (3 of 100,000 draws as extreme)"
    assert format_p(0.012134, "monte_carlo", 100_000).startswith("≤ 0.013 (")
    assert format_p(0.59672, "exact", 4096) == "0.5968" and format_p(6.5e-05, "exact", 2**20) == "6.5e-05"
    assert format_p(1.0, "exact", 4) == "1" and format_p(1.0, "monte_carlo", 999) == "1"
    mc = sign_flip_test(np.ones(30), n_resamples=999, lattice=False)
    assert mc.p_text() == "≤ 0.002 (0 of 999 draws as extreme)"


@pytest.mark.parametrize("seed", range(3))
def test_no_printed_p_or_bound_is_below_the_value_it_stands_for(seed):
    rng = np.random.default_rng(seed)
    values = np.concatenate([10.0 ** rng.uniform(-9, 0, 2000), [0.05, 0.0375, 1 / 3, 2 / 3, 0.99995, 1.0]])
    for p in values:
        for digits in (1, 2, 4):
            assert float(ceil_sig(p, digits)) >= p
        assert float(format_p(p, "exact", 2**20)) >= p
    for m in (999, 60_000, 100_000):
        for b in rng.integers(0, m // 2, 200):
            p = min(1.0, 2 * (b + 1) / (m + 1))
            text = format_p(p, "monte_carlo", m)
            assert float(text.split()[1]) >= p and f"({b:,} of {m:,} draws as extreme)" in text
    # Adjusted cells as well: every value of a fixed-sequence Holm family, printed, is at least its value
    ps = list(10.0 ** rng.uniform(-6, 0, 7))
    for adj, _ in fixed_sequence_holm(ps):
        assert float(ceil_sig(adj, 2)) >= adj and float(ceil_sig(adj, 4)) >= adj


def test_fixed_sequence_holm_hand_worked():
    # primary 0.03 at the full level; the rest Holm: 0.01 × 3 = 0.03, 0.04 × 2 = 0.08, 0.2; none below 0.03
    got = fixed_sequence_holm([0.03, 0.01, 0.04, 0.2])
    assert [adj for adj, _ in got] == pytest.approx([0.03, 0.03, 0.08, 0.2])
    assert [src for _, src in got] == [0, 1, 2, 3]  # 0.03 = 3 × p[1] (Holm's value, ties keep it)
    # a primary that fails holds every secondary back
    assert [adj for adj, _ in fixed_sequence_holm([0.3, 0.001, 0.002])] == pytest.approx([0.3, 0.3, 0.3])
    assert fixed_sequence_holm([0.2]) == [(0.2, 0)]


# --- exact on the lattice ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_lattice_convolution_matches_full_enumeration(seed):
    rng = np.random.default_rng(seed)
    samples = int(rng.choice([1, 3, 8]))
    k = int(rng.integers(5, 19))
    d = 100.0 * rng.integers(-samples, samples + 1, k) / samples  # multiples of 100 / L, L = samples
    d[d == 0] = 100.0
    lattice, counted = sign_flip_test(d), sign_flip_test(d, lattice=False)
    assert lattice.lattice and not counted.lattice and counted.method == "exact"
    assert lattice.p_value == pytest.approx(counted.p_value, abs=1e-12)
    x, y = np.maximum(d, 0), np.maximum(-d, 0)
    assert lattice.p_value == pytest.approx(scipy_p(x, y), abs=1e-12)


def test_lattice_covers_problems_with_different_numbers_of_pairs():
    # 6 seeds x 1 sample, some pairs indeterminate: per-problem means over 6, 5 or 4 pairs (L = lcm = 60)
    rng = np.random.default_rng(4)
    n_kept = rng.choice([4, 5, 6], 14)
    d = np.array([100.0 * rng.integers(-n, n + 1) / n for n in n_kept])
    lattice, counted = sign_flip_test(d), sign_flip_test(d, lattice=False)
    assert lattice.lattice and lattice.p_value == pytest.approx(counted.p_value, abs=1e-12)


def test_seed_card_shaped_case_is_exact_where_it_printed_a_monte_carlo_estimate():
    # 300 problems, one sample: 81 non-zero differences of ±100 (59 up, 22 down). Exact by the binomial:
    # p = 2 × P(Binomial(81, 1/2) >= 59).
    d = np.array([100.0] * 59 + [-100.0] * 22 + [0.0] * 219)
    res = sign_flip_test(d)
    exact = 2 * sum(math.comb(81, j) for j in range(59, 82)) / 2**81
    assert res.lattice and res.method == "exact" and res.p_value == pytest.approx(exact, rel=1e-9)
    assert res.describe() == "exact, all 2^81 sign patterns (lattice convolution)"


def test_off_a_lattice_large_k_is_monte_carlo():
    d = np.random.default_rng(0).normal(0.3, 1, 40)
    assert sign_flip_test(d, n_resamples=500).method == "monte_carlo"


# --- peak and decline, selection-aware --------------------------------------------------------------------
def _decline(correct, graded) -> tuple[int, float]:
    acc = correct.sum(0) / graded.sum(0)
    peak = int(np.argmax(acc))
    return peak, acc[peak] - acc[-1]


def test_decline_test_against_full_enumeration():
    # 6 problems × 3 steps (the compared step last): every one of the (3!)^6 step relabellings counted.
    correct = np.array([[0, 1, 1], [0, 1, 0], [1, 1, 0], [1, 1, 1], [0, 1, 1], [0, 0, 0]], dtype=float)
    graded = np.ones_like(correct)
    graded[1, 2] = 0  # an indeterminate sample at the compared step
    correct[1, 2] = 0
    peak, observed = _decline(correct, graded)
    hits = total = 0
    for perms in itertools.product(itertools.permutations(range(3)), repeat=6):
        idx = np.array(perms)
        c, g = np.take_along_axis(correct, idx, 1), np.take_along_axis(graded, idx, 1)
        hits += _decline(c, g)[1] >= observed - 1e-12
        total += 1
    exact = hits / total
    res = peak_decline_test(correct, graded, n_resamples=40_000, seed=3)
    assert (res.peak, res.decline) == (peak, pytest.approx(observed))
    assert res.accuracy == pytest.approx([2 / 6, 5 / 6, 3 / 5])
    assert res.n_varying == 4  # problems 3 and 5 are the same at every step
    assert abs(res.p_value - exact) < 5 * math.sqrt(exact * (1 - exact) / 40_000) + 1e-4
    assert peak_decline_test(correct, graded, n_resamples=500, seed=3) == peak_decline_test(
        correct, graded, n_resamples=500, seed=3
    )


def test_no_decline_gives_p_one():
    correct = np.array([[0, 1], [1, 1], [0, 0]], dtype=float)
    res = peak_decline_test(correct, np.ones_like(correct), n_resamples=100)
    assert (res.peak, res.decline, res.p_value) == (1, 0.0, 1.0)


@pytest.mark.parametrize("n_steps", [4, 11])
def test_decline_test_keeps_its_level_when_nothing_changes(n_steps):
    # Each problem has its own success rate, the same at every step: any "decline" is noise. The
    # selection-aware test should reject at about 5%; testing the chosen peak as if fixed in advance
    # (a sign-flip of last − peak) rejects more often the more steps there are to choose from.
    rng = np.random.default_rng(100 + n_steps)
    n_sims, n_problems = 300, 40
    aware = naive = 0
    for i in range(n_sims):
        q = rng.random(n_problems)
        correct = (rng.random((n_problems, n_steps)) < q[:, None]).astype(float)
        res = peak_decline_test(correct, np.ones_like(correct), n_resamples=199, seed=i)
        aware += res.p_value <= 0.05
        d = correct[:, -1] - correct[:, res.peak]
        naive += (
            res.peak != n_steps - 1
            and sign_flip_test(d, n_resamples=999, seed=i, exact_max=12).p_value <= 0.05
        )
    rate, naive_rate = aware / n_sims, naive / n_sims
    print(
        f"{n_steps} evaluations, no true change: selection-aware p <= 0.05 in {rate:.1%}, naive {naive_rate:.1%}"
    )
    se = math.sqrt(0.05 * 0.95 / n_sims)
    assert 0.05 - 3 * se < rate <= 0.05 + 3 * se
    if n_steps == 11:
        assert naive_rate > rate


def test_sign_flip_power_agrees_with_the_seed_count_for_power():
    """analysis/power.py's table: at the seed pairs seeds_for_power asks for, the simulated power is about 80%
    (both sides of the exact/Monte Carlo switch at 12 pairs), and fewer pairs buy less."""
    from analysis.stats import seeds_for_power, sign_flip_power

    for sd, effect in ((9.3, 5.0), (5.0, 3.0), (7.0, 10.3)):
        n = seeds_for_power(sd, effect)
        assert 0.74 <= sign_flip_power(sd, effect, n) <= 0.9
        assert sign_flip_power(sd, effect, max(6, n - 6)) < sign_flip_power(sd, effect, n)
    assert sign_flip_power(9.3, 0.0, 20) <= 0.07  # no effect: about alpha
