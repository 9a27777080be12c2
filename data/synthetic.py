"""Synthetic math tasks with exact answers and worked solutions: the embedded default's task source.

Five families (arithmetic, fractions, linear equations, percentages, sums of arithmetic sequences),
levels 1-5. A higher level adds steps, so its worked solution is longer: at the embedded token cap
the hardest levels often do not fit while levels 1-2 always do (figures in docs/embedded_default.md).
Everything is computed with exact rational arithmetic and is deterministic from the seed.

    python -m data.synthetic --n 600 --seed 0 --out artifacts/synthetic.tasks.json
"""

import argparse
import hashlib
import math
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


def decimal(q: Fraction) -> str:
    """Exact decimal of a fraction whose denominator has only factors 2 and 5 (percent arithmetic)."""
    if q.denominator == 1:
        return str(q.numerator)
    digits = 0
    while (q * 10**digits).denominator != 1:
        digits += 1
        if digits > 12:
            raise ValueError(f"{q} has no short decimal expansion")
    sign = "-" if q < 0 else ""
    whole = abs(q.numerator) * 10**digits // q.denominator
    return f"{sign}{whole // 10**digits}.{whole % 10**digits:0{digits}d}"


def _signed(q: Fraction) -> str:
    """Operand as written after an operator: negative values in parentheses."""
    return f"({latex(q)})" if q < 0 else latex(q)


# --- families: each returns (problem, answer, solution) for a level ---------------------------------
Family = Callable[[random.Random, int], tuple[str, str, str]]


def arithmetic(rng: random.Random, level: int) -> tuple[str, str, str]:
    """A left-nested expression with level + 1 operations, evaluated one operation per step.

    Levels 1-2 only add and subtract one-digit numbers: the easy end for a tiny model.
    """
    top = 9 if level <= 2 else 20
    value = rng.randint(1, top)
    expr, steps = str(value), []
    for i in range(level + 1):
        op = rng.choice("+-" if level <= 2 else "+-*")
        b = rng.randint(2, 9) if op == "*" else rng.randint(1, top)
        new = value + b if op == "+" else value - b if op == "-" else value * b
        sym = "\\times" if op == "*" else op
        expr = f"({expr} {sym} {b})" if i < level else f"{expr} {sym} {b}"
        steps.append(f"{value} {sym} {b} = {new}.")
        value = new
    solution = "We work from the innermost parentheses outward.\n" + "\n".join(steps)
    return f"Compute ${expr}$.", str(value), solution + f"\nThe answer is $\\boxed{{{value}}}$."


def fractions(rng: random.Random, level: int) -> tuple[str, str, str]:
    """A sum (or difference from level 3) of level + 1 fractions, combined pairwise over common denominators."""
    terms = []
    for _ in range(level + 1):
        den = terms[0].denominator if level == 1 and terms else rng.randint(2, 5 + level)
        terms.append(Fraction(rng.randint(1, den - 1), den))  # level 1: one common denominator
    ops = [rng.choice("+-") if level >= 3 else "+" for _ in terms[1:]]
    expr = f"\\frac{{{terms[0].numerator}}}{{{terms[0].denominator}}}"
    total, steps = terms[0], []
    for op, t in zip(ops, terms[1:]):
        expr += f" {op} \\frac{{{t.numerator}}}{{{t.denominator}}}"
        lcm = total.denominator * t.denominator // math.gcd(total.denominator, t.denominator)
        a, b = total * lcm, t * lcm  # numerators over the common denominator
        new = total + t if op == "+" else total - t
        raw = f"\\frac{{{a.numerator}{op}{b.numerator}}}{{{lcm}}}"
        steps.append(f"${latex(total)} {op} {latex(t)} = {raw} = {latex(new)}$.")
        total = new
    solution = "We combine the fractions one at a time over a common denominator.\n" + "\n".join(steps)
    return f"Compute ${expr}$.", latex(total), solution + f"\nThe answer is $\\boxed{{{latex(total)}}}$."


def linear(rng: random.Random, level: int) -> tuple[str, str, str]:
    """One linear equation in x; each level adds a term (or an expansion) to move and combine."""
    r = rng.randint
    x = Fraction(r(0, 9) if level <= 2 else r(-9, 9))
    if level == 1:
        a = r(1, 9)
        b = x + a
        eq = f"x + {a} = {latex(b)}"
        steps = [f"Subtract {a} from both sides: $x = {latex(b)} - {a} = {latex(x)}$."]
    elif level == 2:
        a, b = r(2, 5), r(1, 9)
        c = a * x + b
        eq = f"{a}x + {b} = {latex(c)}"
        steps = [
            f"Subtract {b} from both sides: ${a}x = {latex(c - b)}$.",
            f"Divide by {a}: $x = {latex(x)}$.",
        ]
    else:
        # levels 3-5: a(x + p) + b = c x + d (the bracket from level 4, a second bracket at level 5)
        p = r(1, 9) if level >= 4 else 0
        e, f = (r(2, 5), r(1, 9)) if level == 5 else (0, 0)
        a, c = r(2, 9), r(1, 9)
        while c == a - e:  # x must not cancel
            c = r(1, 9)
        b = r(1, 20)
        if level >= 4:
            x = Fraction(r(-30, 30), r(1, 4))  # fractional solutions at the top levels
        lhs_x, lhs_c = a - e, a * p + e * f + b  # lhs = a(x + p) - e(x - f) + b
        d = lhs_x * x + lhs_c - c * x
        lhs = f"{a}(x + {p})" if p else f"{a}x"
        if e:
            lhs += f" - {e}(x - {f})"
        eq = f"{lhs} + {b} = {_coef(c)} + {latex(d)}"
        steps = []
        if p:
            expanded = f"{a}x + {a * p}" + (f" - {e}x + {e * f}" if e else "")
            steps.append(f"Expand: ${expanded} + {b} = {_coef(c)} + {latex(d)}$.")
            steps.append(f"Combine like terms: ${_coef(lhs_x)} + {lhs_c} = {_coef(c)} + {latex(d)}$.")
        steps += [
            f"Subtract ${_coef(c)}$ from both sides: ${_coef(lhs_x - c)} + {lhs_c} = {latex(d)}$.",
            f"Subtract {_signed(Fraction(lhs_c))} from both sides: ${_coef(lhs_x - c)} = {latex(d - lhs_c)}$.",
            f"Divide by {_signed(Fraction(lhs_x - c))}: $x = {latex(x)}$.",
        ]
    solution = "We isolate x step by step.\n" + "\n".join(steps)
    return f"Solve for $x$: ${eq}$.", latex(x), solution + f"\nThe answer is $\\boxed{{{latex(x)}}}$."


def percent(rng: random.Random, level: int) -> tuple[str, str, str]:
    """A price changed by level successive percentages; each change is one multiplication."""
    value = Fraction(rng.choice((100, 200) if level == 1 else range(20, 420, 20)))
    start, changes, steps = value, [], []
    for _ in range(level):
        pct = rng.choice((5, 10, 15, 20, 25, 30, 40, 50))
        up = rng.random() < 0.5
        factor = 1 + Fraction(pct if up else -pct, 100)
        new = value * factor
        changes.append(f"{'increases' if up else 'decreases'} by {pct}\\%")
        verb = "Increasing" if up else "Decreasing"
        steps.append(
            f"{verb} {decimal(value)} by {pct}\\% gives ${decimal(value)} \\times {decimal(factor)} = {decimal(new)}$."
        )
        value = new
    problem = (
        f"A price of {decimal(start)} dollars "
        + ", then ".join(changes)
        + ". What is the final price in dollars?"
    )
    solution = "We apply the changes in order.\n" + "\n".join(steps)
    return problem, decimal(value), solution + f"\nThe answer is $\\boxed{{{decimal(value)}}}$."


def sequence(rng: random.Random, level: int) -> tuple[str, str, str]:
    """The sum of the first level + 2 terms of an arithmetic sequence, added term by term."""
    n = level + 2
    a = rng.randint(1, 9) if level == 1 else rng.randint(-10 if level >= 3 else 1, 20)
    d = rng.randint(1, 5) if level == 1 else rng.randint(-9 if level >= 4 else 1, 9)
    terms = [a + i * d for i in range(n)]
    listed = ", ".join(str(t) for t in terms[:3])
    problem = f"Find the sum of the first {n} terms of the arithmetic sequence {listed}, $\\ldots$"
    steps = [f"The common difference is {d}, so the terms are {', '.join(str(t) for t in terms)}."]
    total = terms[0]
    for t in terms[1:]:
        steps.append(f"{total} + {_signed(Fraction(t))} = {total + t}.")
        total += t
    solution = "\n".join(steps)
    return problem, str(total), solution + f"\nThe answer is $\\boxed{{{total}}}$."


def _coef(k: int) -> str:
    """Coefficient of x as written: x, -x, 3x."""
    return {1: "x", -1: "-x"}.get(k, f"{k}x")


FAMILIES: dict[str, Family] = {
    "arithmetic": arithmetic,
    "fractions": fractions,
    "linear": linear,
    "percent": percent,
    "sequence": sequence,
}


def task_id(problem: str) -> str:
    return "syn-" + hashlib.sha256(problem.encode()).hexdigest()[:12]


def generate_tasks(n: int, seed: int, levels=LEVELS) -> list[dict]:
    """n distinct tasks, family and level drawn uniformly (a level repeated in `levels` weighs more).

    The same (n, seed, levels) gives the same list, and a smaller n gives its prefix.
    """
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        raise ValueError(f"levels must be a non-empty subset of {LEVELS}, got {tuple(levels)}")
    rng = random.Random(f"capgrpo-synthetic-{seed}")
    names = sorted(FAMILIES)
    tasks, seen = [], set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct synthetic tasks at levels {tuple(levels)}")
        subject, level = rng.choice(names), rng.choice(tuple(levels))
        problem, answer, solution = FAMILIES[subject](rng, level)
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
    ap.add_argument("--out", required=True, help="snapshot path (*.tasks.json)")
    args = ap.parse_args(argv)
    print(write_snapshot(generate_tasks(args.n, args.seed, tuple(args.levels)), args.out))


if __name__ == "__main__":
    main()
