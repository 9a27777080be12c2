"""Synthetic math tasks with exact answers and worked solutions: the embedded default's task source.

Four families (arithmetic, fractions, linear equations, sums of arithmetic sequences), levels 1-5, on
small numbers: each step of a worked solution is a one- or two-digit operation that a model of a few
million parameters can learn, and a higher level adds steps, so its solution is longer (figures in
docs/embedded_default.md). Everything is computed with exact rational arithmetic and is deterministic
from the seed.

    python -m data.synthetic --n 1200 --seed 0 --out artifacts/synthetic.tasks.json
    python -m data.synthetic --n 1200 --seed 0 --families sum --levels 1 --out artifacts/sum2.tasks.json

`sum` (REAL_BASE_FAMILIES) is for a real pretrained chat base (docs/experiment-real/): one addition.
"""

import argparse
import hashlib
import random
from collections.abc import Callable
from fractions import Fraction

LEVELS = (1, 2, 3, 4, 5)


# --- number formatting: answers are the bare content of \boxed{} and must parse under math-verify -----
def latex(q: Fraction) -> str:
    """Integer, or `\\frac{p}{q}` with the sign in front."""
    if q.denominator == 1:
        return str(q.numerator)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def _signed(q: Fraction) -> str:
    """Operand as written after an operator: negative values in parentheses."""
    return f"({latex(q)})" if q < 0 else latex(q)


# --- families: each returns (problem, answer, solution) for a level ---------------------------------
Family = Callable[[random.Random, int], tuple[str, str, str]]


def arithmetic(rng: random.Random, level: int) -> tuple[str, str, str]:
    """A left-nested expression with level + 1 operations on one-digit numbers, one operation per step.

    From level 3 a step may multiply by 2 or 3; every intermediate value stays in 0..99, so each step is a
    small-table lookup a tiny model can learn, and a level adds one step.
    """
    value = rng.randint(1, 9)
    expr, steps = str(value), []
    for i in range(level + 1):
        ops = [op for op in "+-*" if op != "*" or (level >= 3 and value <= 30)]
        op = rng.choice(ops)
        if op == "-" and value < 2:
            op = "+"
        b = rng.randint(2, 3) if op == "*" else rng.randint(1, min(9, value) if op == "-" else 9)
        new = value + b if op == "+" else value - b if op == "-" else value * b
        sym = "\\times" if op == "*" else op
        expr = f"({expr} {sym} {b})" if i < level else f"{expr} {sym} {b}"
        steps.append(f"{value} {sym} {b} = {new}.")
        value = new
    solution = "We work from the innermost parentheses outward.\n" + "\n".join(steps)
    return f"Compute ${expr}$.", str(value), solution + f"\nThe answer is $\\boxed{{{value}}}$."


def fractions(rng: random.Random, level: int) -> tuple[str, str, str]:
    """level + 1 fractions over one denominator, combined one at a time (differences from level 3),
    and the result reduced in a last step when it is not in lowest terms."""
    den = rng.randint(3, 9)
    nums = [rng.randint(1, den - 1) for _ in range(level + 1)]
    ops = [rng.choice("+-") if level >= 3 else "+" for _ in nums[1:]]
    frac = lambda n: f"\\frac{{{n}}}{{{den}}}"  # noqa: E731
    expr, total, steps = frac(nums[0]), nums[0], []
    for op, n in zip(ops, nums[1:]):
        if op == "-" and n >= total:  # numerators stay positive
            op = "+"
        expr += f" {op} {frac(n)}"
        new = total + n if op == "+" else total - n
        steps.append(f"${frac(total)} {op} {frac(n)} = {frac(new)}$.")
        total = new
    value = Fraction(total, den)
    if value.denominator != den:
        steps.append(f"${frac(total)} = {latex(value)}$.")
    solution = "We combine the fractions one at a time.\n" + "\n".join(steps)
    return f"Compute ${expr}$.", latex(value), solution + f"\nThe answer is $\\boxed{{{latex(value)}}}$."


def linear(rng: random.Random, level: int) -> tuple[str, str, str]:
    """One linear equation in x with a small integer solution; each level adds a term to move or a
    bracket to expand."""
    r = rng.randint
    x = r(0, 9) if level <= 2 else r(-9, 9)
    if level == 1:
        x, a = r(0, 20), r(1, 20)
        eq = f"x + {a} = {x + a}"
        steps = [f"Subtract {a} from both sides: $x = {x + a} - {a} = {x}$."]
    elif level == 2:
        a, b = r(2, 5), r(1, 9)
        eq = f"{a}x + {b} = {a * x + b}"
        steps = [f"Subtract {b} from both sides: ${a}x = {a * x}$.", f"Divide by {a}: $x = {x}$."]
    else:
        # levels 3-5: a(x + p) + b = c x + d, with the bracket from level 4 and a second one at level 5
        p = r(1, 5) if level >= 4 else 0
        e, f = (r(2, 3), r(1, 5)) if level == 5 else (0, 0)
        a, c = r(2, 5), r(1, 5)
        while c == a - e:  # x must not cancel
            c = r(1, 5)
        b = r(1, 9)
        lhs_x, lhs_c = a - e, a * p + e * f + b  # lhs = a(x + p) - e(x - f) + b
        d = lhs_x * x + lhs_c - c * x
        lhs = f"{a}(x + {p})" if p else f"{a}x"
        if e:
            lhs += f" - {e}(x - {f})"
        eq = f"{lhs} + {b} = {_coef(c)} + {_signed(Fraction(d))}"
        steps = []
        if p:
            expanded = f"{a}x + {a * p}" + (f" - {e}x + {e * f}" if e else "")
            steps.append(f"Expand: ${expanded} + {b} = {_coef(c)} + {_signed(Fraction(d))}$.")
            steps.append(
                f"Combine like terms: ${_coef(lhs_x)} + {lhs_c} = {_coef(c)} + {_signed(Fraction(d))}$."
            )
        steps += [
            f"Subtract ${_coef(c)}$ from both sides: ${_coef(lhs_x - c)} + {lhs_c} = {d}$.",
            f"Subtract {lhs_c} from both sides: ${_coef(lhs_x - c)} = {d - lhs_c}$.",
            f"Divide by {_signed(Fraction(lhs_x - c))}: $x = {x}$.",
        ]
    solution = "We isolate x step by step.\n" + "\n".join(steps)
    return f"Solve for $x$: ${eq}$.", str(x), solution + f"\nThe answer is $\\boxed{{{x}}}$."


def sequence(rng: random.Random, level: int) -> tuple[str, str, str]:
    """The sum of the first level + 2 terms of an arithmetic sequence of small numbers, added term by term."""
    n = level + 2
    a, d = rng.randint(1, 25), rng.randint(1, 7)
    terms = [a + i * d for i in range(n)]
    listed = ", ".join(str(t) for t in terms[:3])
    problem = f"Find the sum of the first {n} terms of the arithmetic sequence {listed}, $\\ldots$"
    steps = [f"The common difference is {d}, so the terms are {', '.join(str(t) for t in terms)}."]
    total = terms[0]
    for t in terms[1:]:
        steps.append(f"{total} + {t} = {total + t}.")
        total += t
    solution = "\n".join(steps)
    return problem, str(total), solution + f"\nThe answer is $\\boxed{{{total}}}$."


def sum_of_terms(rng: random.Random, level: int) -> tuple[str, str, str]:
    """ "What is a + b?" with level + 1 terms (two-digit at level 1, up to 30 from level 2): one operation a
    pretrained chat model of 135M parameters gets right sometimes (docs/experiment-real/PLAN.md), for a
    real base rather than the embedded one."""
    top = 50 if level == 1 else 30
    terms = [rng.randint(1, top) for _ in range(level + 1)]
    expr = " + ".join(map(str, terms))
    total = sum(terms)
    return f"What is {expr}?", str(total), f"{expr} = {total}.\nThe answer is $\\boxed{{{total}}}$."


def _coef(k: int) -> str:
    """Coefficient of x as written: x, -x, 3x."""
    return {1: "x", -1: "-x"}.get(k, f"{k}x")


FAMILIES: dict[str, Family] = {  # the embedded default's four, drawn uniformly
    "arithmetic": arithmetic,
    "fractions": fractions,
    "linear": linear,
    "sequence": sequence,
}
REAL_BASE_FAMILIES: dict[str, Family] = {"sum": sum_of_terms}  # chosen by name (--families sum)


def task_id(problem: str) -> str:
    return "syn-" + hashlib.sha256(problem.encode()).hexdigest()[:12]


def generate_tasks(n: int, seed: int, levels=LEVELS, families: tuple[str, ...] | None = None) -> list[dict]:
    """n distinct tasks, family and level drawn uniformly (a level repeated in `levels` weighs more), from
    `families` (names of FAMILIES or REAL_BASE_FAMILIES; default: the embedded four).

    The same (n, seed, levels, families) gives the same list, and a smaller n gives its prefix.
    """
    known = FAMILIES | REAL_BASE_FAMILIES
    if families is not None and (not families or any(f not in known for f in families)):
        raise ValueError(f"families must be a non-empty subset of {sorted(known)}, got {families}")
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {tuple(levels)}")
    rng = random.Random(f"capgrpo-synthetic-{seed}")
    names = sorted(families or FAMILIES)
    tasks, seen = [], set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct synthetic tasks at levels {tuple(levels)}")
        subject, level = rng.choice(names), rng.choice(tuple(levels))
        problem, answer, solution = known[subject](rng, level)
        if problem in seen:  # small levels have few distinct problems; ids must be unique
            continue
        seen.add(problem)
        tasks.append(
            {
                "id": task_id(problem),
                "problem": problem,
                "answer": answer,
                "solution": solution,
                "subject": subject,
                "level": level,
            }
        )
    return tasks


def main(argv: list[str] | None = None) -> None:
    from data.snapshot import write_snapshot

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    ap.add_argument("--families", nargs="+", default=None, help="default: the embedded four")
    ap.add_argument("--out", required=True, help="snapshot path (*.tasks.json)")
    args = ap.parse_args(argv)
    families = tuple(args.families) if args.families else None
    print(write_snapshot(generate_tasks(args.n, args.seed, tuple(args.levels), families), args.out))


if __name__ == "__main__":
    main()
