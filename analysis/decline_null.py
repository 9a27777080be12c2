"""How often the peak-and-decline test rejects when nothing changes (docs/compare.md).

    python -m analysis.decline_null [--steps 4,7,11] [--problems 300] [--sims 1000] [--resamples 199]

Every problem has accuracy 0.5 at every evaluated step, one sample per problem (heldout300's shape), so
any decline from the best step to the last is noise. Prints, per number of evaluated steps, the share of
simulations with p <= 0.05 for the selection-aware test (analysis.stats.peak_decline_test) and for the
test it replaced: a sign-flip test of last − peak with the peak treated as fixed in advance.
"""

import argparse

import numpy as np

from analysis.stats import peak_decline_test, sign_flip_test


def rejection_rates(
    n_steps: int, *, problems: int, sims: int, resamples: int, seed: int = 0
) -> tuple[float, float]:
    rng = np.random.default_rng([seed, n_steps])
    aware = naive = 0
    for i in range(sims):
        correct = (rng.random((problems, n_steps)) < 0.5).astype(float)
        res = peak_decline_test(correct, np.ones_like(correct), n_resamples=resamples, seed=i)
        aware += res.p_value <= 0.05
        if res.peak != n_steps - 1:
            d = correct[:, -1] - correct[:, res.peak]
            naive += sign_flip_test(d, n_resamples=999, seed=i, exact_max=12).p_value <= 0.05
    return aware / sims, naive / sims


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.decline_null", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--steps", default="4,7,11", help="numbers of evaluated steps (default 4,7,11)")
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=199, help="permutations per test (default 199)")
    args = parser.parse_args(argv)
    print("| evaluated steps | selection-aware: p <= 0.05 | peak as if fixed: p <= 0.05 |\n|---|---|---|")
    for n in map(int, args.steps.split(",")):
        aware, naive = rejection_rates(n, problems=args.problems, sims=args.sims, resamples=args.resamples)
        print(f"| {n} | {aware:.1%} | {naive:.1%} |", flush=True)


if __name__ == "__main__":
    main()
