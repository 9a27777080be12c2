"""The synthetic task generator: deterministic, exact answers, gradeable worked solutions, longer at higher levels."""

import hashlib
import re
import statistics
from fractions import Fraction

import pytest
import sympy

from data.snapshot import load_snapshot
from data.synthetic import FAMILIES, LEVELS, generate_tasks, main
from rewards.boxed import last_boxed
from rewards.grader import grade
from rewards.outcome import Outcome

TASKS = generate_tasks(400, seed=7)


def by_family(name: str) -> list[dict]:
    return [t for t in TASKS if t["subject"] == name]


def test_same_seed_same_tasks_other_seed_other_tasks():
    assert generate_tasks(60, seed=3) == generate_tasks(60, seed=3)
    assert generate_tasks(60, seed=3) != generate_tasks(60, seed=4)
    assert generate_tasks(20, seed=3) == generate_tasks(60, seed=3)[:20]  # a prefix, not a reshuffle


def test_fields_ids_and_coverage():
    assert {t["subject"] for t in TASKS} == set(FAMILIES)
    assert {t["level"] for t in TASKS} == set(LEVELS)
    assert len({t["id"] for t in TASKS}) == len(TASKS)
    for t in TASKS:
        assert t["id"] == "syn-" + hashlib.sha256(t["problem"].encode()).hexdigest()[:12]
        assert set(t) == {"id", "problem", "answer", "solution", "subject", "level"}


def test_levels_argument_restricts_and_is_checked():
    assert {t["level"] for t in generate_tasks(30, seed=1, levels=(1, 2))} == {1, 2}
    with pytest.raises(ValueError, match="levels"):
        generate_tasks(5, seed=1, levels=(0, 6))


def test_solutions_end_in_the_answer_and_grade_correct():
    for t in TASKS:
        assert t["solution"].rstrip().endswith(f"\\boxed{{{t['answer']}}}$.")
        assert last_boxed(t["solution"]) == t["answer"]
    for t in TASKS[:50]:  # math-verify is the slow part; an eighth covers every family and level
        assert grade(t["solution"], t["answer"], truncated=False).outcome is Outcome.CORRECT, t


def _number(answer: str) -> Fraction:
    """Independent reading of an answer string: integer, decimal or (-)\\frac{p}{q}."""
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", answer)
    if m:
        return (-1 if m.group(1) else 1) * Fraction(int(m.group(2)), int(m.group(3)))
    return Fraction(answer)


def test_arithmetic_and_fraction_answers_recomputed():
    for t in by_family("arithmetic"):
        expr = t["problem"].removeprefix("Compute $").removesuffix("$.").replace("\\times", "*")
        assert Fraction(eval(expr, {"__builtins__": {}})) == _number(t["answer"]), t  # digits, + - * ( ) only
    for t in by_family("fractions"):
        expr = re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"Fraction(\1, \2)", t["problem"][len("Compute $") : -2])
        assert eval(expr, {"__builtins__": {}, "Fraction": Fraction}) == _number(t["answer"]), t


def test_linear_answers_solve_the_equation():
    x = sympy.Symbol("x")
    for t in by_family("linear"):
        equation = t["problem"].removeprefix("Solve for $x$: $").removesuffix("$.")
        equation = re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"(\1/\2)", equation)
        lhs, rhs = (re.sub(r"(\d)([x(])", r"\1*\2", side) for side in equation.split("="))
        (solution,) = sympy.solve(sympy.sympify(lhs) - sympy.sympify(rhs), x)
        assert Fraction(str(solution)) == _number(t["answer"]), t


def test_sequence_answers_recomputed():
    for t in by_family("sequence"):
        n, first, second = map(
            int,
            re.match(r"Find the sum of the first (\d+) terms .*? (-?\d+), (-?\d+),", t["problem"]).groups(),
        )
        assert sum(first + i * (second - first) for i in range(n)) == _number(t["answer"]), t


def test_higher_levels_need_longer_solutions():
    for name in FAMILIES:
        mean = [
            statistics.mean(len(t["solution"]) for t in by_family(name) if t["level"] == lv) for lv in LEVELS
        ]
        assert mean == sorted(mean), (name, mean)


def test_cli_writes_a_snapshot_and_prints_its_sha256(tmp_path, capsys):
    path = tmp_path / "syn.tasks.json"
    main(["--n", "25", "--seed", "5", "--out", str(path)])
    sha = capsys.readouterr().out.strip()
    data = load_snapshot(path, expected_sha256=sha)
    assert data["id"] == [t["id"] for t in generate_tasks(25, seed=5)]


def test_arithmetic_steps_stay_small_enough_for_a_tiny_model():
    """Every operand and intermediate value of an arithmetic chain is in 0..99 (docs/embedded_default.md)."""
    for t in by_family("arithmetic"):
        numbers = [int(n) for n in re.findall(r"-?\d+", t["solution"])]
        assert numbers and all(0 <= n <= 99 for n in numbers), t
