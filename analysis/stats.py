"""Paired sign-flip permutation tests (SPEC §7): over problems, and over training seeds.

Under the null hypothesis "the two arms are exchangeable within each pair", every per-pair difference
is as likely to have come out with the opposite sign. The statistic is the mean difference; its null
distribution is the mean over all sign patterns of the differences.

Conventions, chosen to match `scipy.stats.permutation_test(..., permutation_type='samples',
alternative='two-sided')` so that its p-values can serve as the reference:
- two-sided p = 2 * min(P(T <= observed), P(T >= observed)), clipped to 1;
- exact: P(.) is the share of all sign patterns, counted on the lattice the differences lie on (per-problem
  differences are multiples of 100/L pp, L the pairs a problem keeps) or, off a lattice, enumerated when
  at most EXACT_MAX are non-zero; Monte Carlo otherwise: P(.) = (b + 1) / (m + 1) with b of m random
  patterns at least as extreme (the observed pattern counts as one draw, so p is never 0);
- zero differences are kept in n and in the mean. Flipping a zero changes nothing, so only the k
  non-zero differences are flipped: each of their 2^k patterns stands for 2^(n-k) identical ones,
  which leaves every share, and hence the p-value, unchanged.
"""

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from fractions import Fraction
from statistics import NormalDist
from typing import Literal

import numpy as np

EXACT_MAX = 20  # 2^20 patterns take well under a second; beyond that, off a lattice, Monte Carlo
LATTICE_MAX_DENOMINATOR = 10_000  # differences are multiples of 100/L pp with L <= samples x seeds
LATTICE_MAX_CELLS = 50_000_000  # k x support of the null sum: ~0.1 s of numpy; above it, not a lattice
_CHUNK_ELEMENTS = 1 << 21  # signs materialised per chunk (~16 MB as int64): bounded memory at any k
_TIE_RTOL = 1e-9  # null sums this close (relative to sum |d|) to the observed sum are ties, not float noise
ALPHA = 0.05  # the level every report tests and plans power at
POWER = 0.8
SMALLEST_EFFECT_PP = 3.0  # smallest A − B worth detecting (docs/compare.md): the power line plans for it


@dataclass(frozen=True)
class SignFlipResult:
    n: int  # pairs, zero differences included
    n_nonzero: int
    mean_diff: float
    p_value: float
    method: Literal["exact", "monte_carlo"]
    n_resamples: int  # sign patterns used: 2**n_nonzero when exact, the random draws when Monte Carlo
    lattice: bool = False  # exact by convolution on the differences' lattice rather than by enumeration

    def describe(self) -> str:
        """How the p-value was obtained, in words for a report."""
        if self.n_nonzero == 0:
            return "exact: all differences are zero"
        if self.lattice:
            return f"exact, all 2^{self.n_nonzero} sign patterns (lattice convolution)"
        if self.method == "exact":
            return f"exact, all 2^{self.n_nonzero} = {self.n_resamples:,} sign patterns"
        return f"Monte Carlo, {self.n_resamples:,} random sign patterns"

    def p_text(self) -> str:
        return format_p(self.p_value, self.method, self.n_resamples)


def sign_flip_test(
    diffs, *, n_resamples: int = 100_000, seed: int = 0, exact_max: int = EXACT_MAX, lattice: bool = True
) -> SignFlipResult:
    """Paired sign-flip test of mean(diffs) == 0: exact on a lattice (when `lattice`) or when at most
    `exact_max` differences are non-zero, Monte Carlo otherwise."""
    d = np.asarray(diffs, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"sign_flip_test needs a non-empty 1-D array of differences, got shape {d.shape}")
    if not np.all(np.isfinite(d)):
        raise ValueError("sign_flip_test: differences must be finite (found NaN or inf)")
    if n_resamples < 1:
        raise ValueError(f"sign_flip_test: n_resamples must be >= 1, got {n_resamples}")
    nonzero = d[d != 0]
    k = nonzero.size
    # Work with sums: the mean is the sum over the fixed n, so the ordering of patterns is the same.
    observed = float(nonzero.sum())
    tol = _TIE_RTOL * float(np.abs(nonzero).sum())
    grid = _lattice(nonzero) if lattice and k else None
    if grid is not None:
        p_ge, p_le = _lattice_tails(grid)
        m, method = 2**k, "exact"
    elif k <= exact_max:
        n_ge, n_le, m = _count_exact(nonzero, observed, tol)
        p_ge, p_le, method = n_ge / m, n_le / m, "exact"
    else:
        m = n_resamples
        n_ge, n_le = _count_monte_carlo(nonzero, observed, tol, m, seed)
        p_ge, p_le, method = (n_ge + 1) / (m + 1), (n_le + 1) / (m + 1), "monte_carlo"
    p = min(1.0, 2.0 * min(p_ge, p_le))
    return SignFlipResult(d.size, k, float(d.mean()), p, method, m, grid is not None)


def _lattice(d: np.ndarray) -> np.ndarray | None:
    """Integers v with d = v * u for one unit u, when the differences lie on a small rational grid and the
    null sum's support is small enough to convolve; None otherwise."""
    fracs = [Fraction(float(x)).limit_denominator(LATTICE_MAX_DENOMINATOR) for x in d]
    if any(abs(float(f) - x) > 1e-11 * max(1.0, abs(x)) for f, x in zip(fracs, d.tolist())):
        return None
    den = math.lcm(*(f.denominator for f in fracs))
    nums = [f.numerator * (den // f.denominator) for f in fracs]
    g = math.gcd(*nums)
    v = [n // g for n in nums]
    if len(v) * (2 * sum(map(abs, v)) + 1) > LATTICE_MAX_CELLS:
        return None
    return np.asarray(v, dtype=np.int64)


def _lattice_tails(v: np.ndarray) -> tuple[float, float]:
    """P(T >= observed), P(T <= observed) for T = sum of ±v_i with fair independent signs: the exact null
    distribution on the integers, one two-point convolution per difference. Ties are exact."""
    total = int(np.abs(v).sum())
    dist = np.zeros(2 * total + 1)
    dist[total] = 1.0
    for x in np.abs(v).tolist():
        new = np.zeros_like(dist)
        new[x:] += 0.5 * dist[: dist.size - x]
        new[: dist.size - x] += 0.5 * dist[x:]
        dist = new
    at = total + int(v.sum())
    return float(dist[at:].sum()), float(dist[: at + 1].sum())


def _count_exact(d: np.ndarray, observed: float, tol: float) -> tuple[int, int, int]:
    """Patterns with sum >= / <= observed among all 2^k; pattern i flips d[j] where bit j of i is set."""
    k, total = d.size, 1 << d.size
    bits = np.arange(k, dtype=np.int64)
    chunk = max(1, _CHUNK_ELEMENTS // max(k, 1))
    n_ge = n_le = 0
    for start in range(0, total, chunk):
        idx = np.arange(start, min(start + chunk, total), dtype=np.int64)
        signs = 1 - 2 * ((idx[:, None] >> bits) & 1)
        sums = signs @ d
        n_ge += int(np.count_nonzero(sums >= observed - tol))
        n_le += int(np.count_nonzero(sums <= observed + tol))
    return n_ge, n_le, total


def _count_monte_carlo(d: np.ndarray, observed: float, tol: float, m: int, seed: int) -> tuple[int, int]:
    """Like _count_exact over m seeded random sign patterns."""
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // d.size)
    n_ge = n_le = 0
    for start in range(0, m, chunk):
        rows = min(chunk, m - start)
        signs = 1 - 2 * rng.integers(0, 2, size=(rows, d.size), dtype=np.int8)
        sums = signs @ d
        n_ge += int(np.count_nonzero(sums >= observed - tol))
        n_le += int(np.count_nonzero(sums <= observed + tol))
    return n_ge, n_le


# --- printing: never below the value printed --------------------------------------------------------
def ceil_sig(x: float, digits: int) -> str:
    """x rounded UP to `digits` significant digits, so that float(printed) >= x."""
    if x <= 0:
        return "0"
    d = Decimal(repr(float(x)))
    q = d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1), rounding=ROUND_CEILING)
    return f"{float(q):.{digits}g}"


def format_p(p: float, method: str, n_resamples: int, *, tails: int = 2) -> str:
    """Exact p rounded up to four significant digits. A Monte Carlo p, tails x (b + 1) / (m + 1), is what
    the draws allow the exact p to be claimed at: printed rounded up to two digits as
    "≤ p (b of m draws as extreme)"."""
    if method != "monte_carlo":
        return ceil_sig(p, 4)
    if p >= 1:
        return "1"
    b = round(p * (n_resamples + 1) / tails) - 1  # p = tails (b + 1) / (m + 1) below the cap at 1
    return f"≤ {ceil_sig(p, 2)} ({b:,} of {n_resamples:,} draws as extreme)"


# --- multiplicity -------------------------------------------------------------------------------------
def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the i-th smallest (from 1)
    is multiplied by m − i + 1, made non-decreasing along the order and capped at 1."""
    return [adj for adj, _ in _holm_sources([float(x) for x in p_values])]


def _holm_sources(p: list[float]) -> list[tuple[float, int]]:
    """Holm-adjusted p per input, with the index of the raw p that value is a multiple of."""
    m, out, running = len(p), [(0.0, 0)] * len(p), (0.0, -1)
    for rank, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        candidate = min(1.0, (m - rank) * p[i])
        if candidate > running[0] or running[1] < 0:
            running = (candidate, i)
        out[i] = running
    return out


def fixed_sequence_holm(p_values) -> list[tuple[float, int]]:
    """Gatekeeping: the first p-value (the primary, fixed before the run) at the full level, then Holm over
    the rest, none adjusted below the primary (a secondary cannot pass where the primary did not). Returns
    (adjusted p, index of the raw p it rests on) in the input order."""
    p = [float(x) for x in p_values]
    if not p:
        return []
    rest = [(adj, src + 1) for adj, src in _holm_sources(p[1:])]
    return [(p[0], 0)] + [max(r, (p[0], 0), key=lambda t: t[0]) for r in rest]


# --- the training run as the unit ---------------------------------------------------------------------
def min_seeds(alpha: float = ALPHA) -> int:
    """Fewest seed pairs whose exact two-sided sign-flip test can reach p <= alpha (2 / 2^n <= alpha)."""
    return max(1, math.ceil(math.log2(2 / alpha)))


def sign_flip_rows(diffs: np.ndarray) -> np.ndarray:
    """Exact two-sided sign-flip p of each row's mean (all 2^n patterns; n up to ~16), vectorised: what
    sign_flip_test gives row by row, for simulations."""
    d = np.asarray(diffs, dtype=np.float64)
    n = d.shape[1]
    patterns = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
    sums = d @ patterns.T
    observed = d.sum(1, keepdims=True)
    tol = _TIE_RTOL * np.abs(d).sum(1, keepdims=True)
    upper, lower = (sums >= observed - tol).mean(1), (sums <= observed + tol).mean(1)
    return np.minimum(1.0, 2 * np.minimum(upper, lower))


POWER_SIMULATED_MAX = 12  # seeds up to which power is simulated; beyond, the t approximation is close
POWER_SIMS = 4000


def seeds_for_power(sd: float, effect: float, *, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Seed pairs (seeds per arm) for `power` at a true mean per-seed difference `effect`, per-seed
    differences of SD `sd`, for the exact sign-flip over seeds. Start from the one-sample t-test's normal
    approximation with Guenther's correction, n = (z_(1-α/2) + z_power)² (sd / effect)² + z_(1-α/2)² / 2,
    no fewer than min_seeds(alpha); up to POWER_SIMULATED_MAX seeds, where the sign-flip's discreteness
    costs about a seed, add seeds until its power simulated on normal differences (POWER_SIMS draws, seed 0)
    reaches `power`. None when the effect is zero or a number is not finite."""
    if not (math.isfinite(sd) and math.isfinite(effect)) or effect == 0:
        return None
    z_a, z_b = NormalDist().inv_cdf(1 - alpha / 2), NormalDist().inv_cdf(power)
    n = max(min_seeds(alpha), math.ceil((z_a + z_b) ** 2 * (sd / effect) ** 2 + z_a**2 / 2 - 1e-9))
    rng = np.random.default_rng(0)
    while n <= POWER_SIMULATED_MAX and sd > 0:
        diffs = rng.normal(abs(effect) / sd, 1.0, (POWER_SIMS, n))
        if float((sign_flip_rows(diffs) <= alpha).mean()) >= power:
            break
        n += 1
    return n


def sign_flip_power(sd: float, effect: float, pairs: int, *, alpha: float = ALPHA, sims: int = 2000,
                    patterns: int = 4096, seed: int = 0) -> float:  # fmt: skip
    """Power of the two-sided sign-flip test over `pairs` seed pairs whose per-pair differences are normal with
    mean `effect` and SD `sd`, simulated (`sims` draws, seed `seed`): exact over all 2^n sign patterns up to 12
    pairs, beyond that over `patterns` random patterns plus the observed one (a Monte Carlo p)."""
    rng = np.random.default_rng(seed)
    diffs = rng.normal(effect, sd, (sims, pairs))
    if pairs <= POWER_SIMULATED_MAX:
        return float((sign_flip_rows(diffs) <= alpha).mean())
    signs = np.vstack([np.ones(pairs), rng.choice([-1.0, 1.0], (patterns, pairs))])
    sums, observed = diffs @ signs.T, diffs.sum(1, keepdims=True)
    tol = _TIE_RTOL * np.abs(diffs).sum(1, keepdims=True)
    upper, lower = (sums >= observed - tol).mean(1), (sums <= observed + tol).mean(1)
    return float((np.minimum(1.0, 2 * np.minimum(upper, lower)) <= alpha).mean())


# --- peak and decline with the peak re-selected under the null --------------------------------------
@dataclass(frozen=True)
class DeclineResult:
    peak: int  # index of the peak step among the steps given (the last is the compared step)
    accuracy: list[float]  # per step: correct / graded over every problem
    decline: float  # accuracy at the peak − accuracy at the compared step (>= 0)
    p_value: float  # one-sided: a decline at least this large with the peak chosen after looking
    n_resamples: int
    n_varying: int  # problems whose counts are not the same at every step (only they move under the null)
    method: Literal["monte_carlo"] = "monte_carlo"

    def p_text(self) -> str:
        return format_p(self.p_value, self.method, self.n_resamples, tails=1)

    def describe(self) -> str:
        return (
            f"step permutation within problem, peak re-selected in each of {self.n_resamples:,} "
            "Monte Carlo permutations"
        )


def peak_decline_test(correct, graded, *, n_resamples: int = 100_000, seed: int = 0) -> DeclineResult:
    """Selection-aware test of a decline from the peak to the last of S steps.

    correct, graded: (problems, steps) counts, the compared step last. Accuracy at a step is
    Σ correct / Σ graded; the peak is the most accurate step (the earliest of ties) and the statistic is
    accuracy(peak) − accuracy(last). Under the null "the steps do not differ", each problem's counts are
    exchangeable across steps, so each permutation shuffles every problem's step labels independently, then
    picks its own peak by the same rule: the p-value accounts for the peak having been chosen after
    looking. p = (b + 1) / (m + 1) with b of m permutations giving a decline at least the observed one.
    """
    c, g = np.asarray(correct, dtype=np.float64), np.asarray(graded, dtype=np.float64)
    if c.ndim != 2 or c.shape != g.shape or c.shape[1] < 1:
        raise ValueError(
            f"peak_decline_test needs (problems, steps) arrays of one shape, got {c.shape}, {g.shape}"
        )
    if n_resamples < 1:
        raise ValueError(f"peak_decline_test: n_resamples must be >= 1, got {n_resamples}")
    acc = _accuracy(c.sum(0), g.sum(0))
    peak = int(np.argmax(np.where(np.isnan(acc), -np.inf, acc)))  # argmax takes the first of ties
    decline = float(acc[peak] - acc[-1]) if not np.isnan(acc[-1]) else 0.0
    # Problems with the same counts at every step contribute a constant to every step: leave them out
    # of the shuffling (same p, less work).
    varying = ~(np.all(c == c[:, :1], axis=1) & np.all(g == g[:, :1], axis=1))
    cv, gv = c[varying], g[varying]
    base_c, base_g = c[~varying, 0].sum(), g[~varying, 0].sum()
    n_steps, k = c.shape[1], int(varying.sum())
    if decline <= 0 or k == 0:
        return DeclineResult(peak, acc.tolist(), max(decline, 0.0), 1.0, n_resamples, k)
    tol = 1e-12
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // (k * n_steps))
    order = np.broadcast_to(np.arange(n_steps), (chunk, k, n_steps))
    b = 0
    for start in range(0, n_resamples, chunk):
        rows = min(chunk, n_resamples - start)
        perm = rng.permuted(order[:rows], axis=2)
        sc = np.take_along_axis(np.broadcast_to(cv, (rows, k, n_steps)), perm, axis=2).sum(1) + base_c
        sg = np.take_along_axis(np.broadcast_to(gv, (rows, k, n_steps)), perm, axis=2).sum(1) + base_g
        a = _accuracy(sc, sg)
        d = np.nanmax(np.where(np.isnan(a), -np.inf, a), axis=1) - a[:, -1]
        b += int(np.count_nonzero(np.nan_to_num(d, nan=0.0) >= decline - tol))
    return DeclineResult(peak, acc.tolist(), decline, (b + 1) / (n_resamples + 1), n_resamples, k)


def _accuracy(correct: np.ndarray, graded: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(graded > 0, correct / np.where(graded > 0, graded, 1), np.nan)
