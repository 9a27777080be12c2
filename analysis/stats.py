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
