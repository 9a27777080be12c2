"""How often the seed-level and the problem-level tests reject when the arms do not differ (docs/compare.md).

    python -m analysis.seed_null [--seeds 3,6,8] [--seed-sd 0,1.5,3] [--problems 300] [--sims 4000]

Null runs: every problem has a success rate q ~ U(0.1, 0.9), the same in both arms. Each training run (an
arm's run of one seed) shifts every problem by its own offset (the seed effect; the two runs of a seed pair
differ by SD `seed_sd` pp) and each problem by its own noise (SD 5 pp: a checkpoint is better at some
problems than at others); one sample per problem (heldout300's shape). Both arms are drawn alike, so any
rejection is a false positive. Prints, per number of seeds and seed SD, the share of simulations with
p <= 0.05 for the exact sign-flip over seeds (analysis.stats.sign_flip_test on the per-seed differences,
vectorised as analysis.stats.sign_flip_rows) and for the problem-level pooled sign-flip (per-problem means over seeds; Monte Carlo
over 999 patterns shared by the simulations).
"""

import argparse
from dataclasses import dataclass

import numpy as np

from analysis.stats import ALPHA, sign_flip_rows

PROBLEM_SD_PP = 5.0  # run-by-problem noise: the part of a checkpoint's skill that is problem-specific
_TIE_RTOL = 1e-9  # as analysis.stats: sums this close to the observed one are ties


@dataclass(frozen=True)
class NullRuns:
    per_seed_pp: np.ndarray  # (sims, seeds): the paired mean A − B of each seed pair, in pp
    per_problem_pp: np.ndarray  # (sims, problems): A − B per problem, the mean over seeds, in pp


def null_runs(n_seeds: int, seed_sd_pp: float, *, problems: int, sims: int, seed: int = 0) -> NullRuns:
    rng = np.random.default_rng([seed, n_seeds, int(round(seed_sd_pp * 1000))])
    q = rng.uniform(0.1, 0.9, (sims, 1, problems))

    def arm() -> np.ndarray:  # (sims, seeds, problems) 0/1 outcomes of one arm's runs
        offset = rng.normal(0.0, seed_sd_pp / 100 / np.sqrt(2), (sims, n_seeds, 1))
        noise = rng.normal(0.0, PROBLEM_SD_PP / 100, (sims, n_seeds, problems))
        return (rng.random((sims, n_seeds, problems)) < np.clip(q + offset + noise, 0, 1)).astype(np.float32)

    d = 100.0 * (arm() - arm())
    return NullRuns(d.mean(axis=2, dtype=np.float64), d.mean(axis=1, dtype=np.float64))


def problem_level_p(per_problem: np.ndarray, *, draws: int = 999, seed: int = 0) -> np.ndarray:
    """Monte Carlo two-sided sign-flip p over problems, one per row, with (b + 1) / (m + 1) per tail."""
    signs = 1 - 2 * np.random.default_rng(seed).integers(0, 2, (draws, per_problem.shape[1]))
    sums = per_problem @ signs.T
    observed = per_problem.sum(1, keepdims=True)
    tol = _TIE_RTOL * np.abs(per_problem).sum(1, keepdims=True)
    upper = ((sums >= observed - tol).sum(1) + 1) / (draws + 1)
    lower = ((sums <= observed + tol).sum(1) + 1) / (draws + 1)
    return np.minimum(1.0, 2 * np.minimum(upper, lower))


def rejection_rates(
    n_seeds: int, seed_sd_pp: float, *, problems: int = 300, sims: int = 4000
) -> tuple[float, float]:
    """Shares of p <= ALPHA: (seed-level, problem-level), simulated 1000 at a time (bounded memory)."""
    seed_hits = problem_hits = 0
    for chunk, start in enumerate(range(0, sims, 1000)):
        runs = null_runs(n_seeds, seed_sd_pp, problems=problems, sims=min(1000, sims - start), seed=chunk)
        seed_hits += int((sign_flip_rows(runs.per_seed_pp) <= ALPHA).sum())
        problem_hits += int((problem_level_p(runs.per_problem_pp, seed=chunk) <= ALPHA).sum())
    return seed_hits / sims, problem_hits / sims


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.seed_null", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seeds", default="3,6,8", help="seed pairs per simulated experiment (default 3,6,8)"
    )
    parser.add_argument(
        "--seed-sd", default="0,1.5,3", help="SD of a seed pair's difference, pp (default 0,1.5,3)"
    )
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--sims", type=int, default=4000)
    args = parser.parse_args(argv)
    print("| seeds | seed SD (pp) | seed-level: p <= 0.05 | problem-level: p <= 0.05 |\n|---|---|---|---|")
    for n in map(int, args.seeds.split(",")):
        for sd in map(float, args.seed_sd.split(",")):
            seed_rate, problem_rate = rejection_rates(n, sd, problems=args.problems, sims=args.sims)
            print(f"| {n} | {sd:g} | {seed_rate:.1%} | {problem_rate:.1%} |", flush=True)


if __name__ == "__main__":
    main()
