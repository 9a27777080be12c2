"""Two-sided paired sign-flip permutation test (SPEC §7).

Under the null hypothesis "the two arms are exchangeable within each pair", every per-pair difference
is as likely to have come out with the opposite sign. The statistic is the mean difference; its null
distribution is the mean over all sign patterns of the differences.

Conventions, chosen to match `scipy.stats.permutation_test(..., permutation_type='samples',
alternative='two-sided')` so that its p-values can serve as the reference:
- two-sided p = 2 * min(P(T <= observed), P(T >= observed)), clipped to 1;
- exact: P(.) is the share of all sign patterns; Monte Carlo: P(.) = (b + 1) / (m + 1) with b of m
  random patterns at least as extreme (the observed pattern counts as one draw, so p is never 0);
- zero differences are kept in n and in the mean. Flipping a zero changes nothing, so only the k
  non-zero differences are enumerated: each of their 2^k patterns stands for 2^(n-k) identical ones,
  which leaves every share, and hence the p-value, unchanged.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np

EXACT_MAX = 20  # 2^20 patterns take well under a second; beyond that, Monte Carlo
_CHUNK_ELEMENTS = 1 << 21  # signs materialised per chunk (~16 MB as int64): bounded memory at any k
_TIE_RTOL = 1e-9  # null sums this close (relative to sum |d|) to the observed sum are ties, not float noise


@dataclass(frozen=True)
class SignFlipResult:
    n: int  # pairs, zero differences included
    n_nonzero: int
    mean_diff: float
    p_value: float
    method: Literal["exact", "monte_carlo"]
    n_resamples: int  # sign patterns used: 2**n_nonzero when exact, the random draws when Monte Carlo

    def describe(self) -> str:
        """How the p-value was obtained, in words for a report."""
        if self.n_nonzero == 0:
            return "exact: all differences are zero"
        if self.method == "exact":
            return f"exact, all 2^{self.n_nonzero} = {self.n_resamples:,} sign patterns"
        return f"Monte Carlo, {self.n_resamples:,} random sign patterns"


def sign_flip_test(
    diffs, *, n_resamples: int = 100_000, seed: int = 0, exact_max: int = EXACT_MAX
) -> SignFlipResult:
    """Paired sign-flip test of mean(diffs) == 0: exact when at most `exact_max` differences are non-zero."""
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
    if k <= exact_max:
        n_ge, n_le, m = _count_exact(nonzero, observed, tol)
        p_ge, p_le, method = n_ge / m, n_le / m, "exact"
    else:
        m = n_resamples
        n_ge, n_le = _count_monte_carlo(nonzero, observed, tol, m, seed)
        p_ge, p_le, method = (n_ge + 1) / (m + 1), (n_le + 1) / (m + 1), "monte_carlo"
    p = min(1.0, 2.0 * min(p_ge, p_le))
    return SignFlipResult(d.size, k, float(d.mean()), p, method, m)


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


def p_floor(method: str, n_resamples: int, tails: int = 2) -> float | None:
    """The smallest p a Monte Carlo test with `n_resamples` draws can give; None for exact tests."""
    return tails / (n_resamples + 1) if method == "monte_carlo" else None


def format_p(p: float, method: str, n_resamples: int, *, tails: int = 2) -> str:
    """Exact p to four significant digits; Monte Carlo p to two, or "< floor (Monte Carlo floor)" when no
    draw was as extreme as the observation (the estimate is then only a bound)."""
    floor = p_floor(method, n_resamples, tails)
    if floor is not None and p <= floor * (1 + 1e-9):
        return f"< {floor:.1g} (Monte Carlo floor)"
    return f"{p:.4g}" if method == "exact" else f"{p:.2g}"


def holm(p_values) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the i-th smallest (from 1)
    is multiplied by m − i + 1, made non-decreasing along the order and capped at 1."""
    p = [float(x) for x in p_values]
    m, adjusted, running = len(p), [0.0] * len(p), 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


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
