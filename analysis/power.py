"""The power a seed count buys, for a plan (issue 62): the two-sided sign-flip test over seed pairs at alpha,
per-pair differences normal with the given SDs, at the given true effects, in percentage points.

    python -m analysis.power --pairs 16 20 24 32 --sd 5 7 9.3 --effect 3 5 10.3
"""

import argparse

from analysis.stats import ALPHA, seeds_for_power, sign_flip_power


def table(pairs: list[int], sds: list[float], effects: list[float], alpha: float = ALPHA) -> str:
    head = " | ".join(f"+{e:g} pp" for e in effects)
    lines = [f"| seed pairs | per-pair SD | {head} |", "|---|---|" + "---|" * len(effects)]
    for sd in sds:
        for n in pairs:
            cells = " | ".join(f"{sign_flip_power(sd, e, n, alpha=alpha):.0%}" for e in effects)
            lines.append(f"| {n} | {sd:g} pp | {cells} |")
    need = ", ".join(f"SD {sd:g}: " + "/".join(str(seeds_for_power(sd, e, alpha=alpha)) for e in effects)
                     for sd in sds)  # fmt: skip
    effects_text = "/".join(f"+{e:g}" for e in effects)
    lines.append(f"\nSeed pairs for 80% power at {effects_text} pp: {need}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.power", description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[16, 20, 24, 32])
    ap.add_argument("--sd", type=float, nargs="+", default=[5.0, 7.0, 9.3])
    ap.add_argument("--effect", type=float, nargs="+", default=[3.0, 5.0, 10.3])
    ap.add_argument("--alpha", type=float, default=ALPHA)
    args = ap.parse_args(argv)
    print(table(args.pairs, args.sd, args.effect, args.alpha))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
