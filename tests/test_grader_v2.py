"""Grader v2: v1 plus normalisations; each rule's test shows the v1 verdict it reverses."""

import json
from pathlib import Path

import pytest

from rewards.grader import GraderPool, grade, judge
from rewards.outcome import GRADER_VERSIONS, Outcome
from rewards.v2 import judge_v2, normalise

MATH500 = Path(__file__).resolve().parents[2] / "shared" / "data" / "math500.jsonl"
C, W, F = Outcome.CORRECT, Outcome.WRONG, Outcome.FORMAT_REJECTED


# (answer, reference, v1 verdict, v2 verdict): v1's verdict is kept in the table so that a math-verify
# upgrade that changes it shows up here, not silently in v2.
REVERSED = [
    # thin-space and other thousands separators: v1 reads 2\,220 as 222
    ("2\\,220", "2220", W, C),
    ("2\\,220", "222", C, W),
    ("1 000", "1000", W, C),
    ("2\u2009220", "2220", W, C),
    # commas inside fractions
    ("\\frac{20,000}{\\pi}", "\\frac{20000}{\\pi}", W, C),
    # degrees
    ("90°", "90^\\circ", W, C),
    ("90°", "90", W, C),
    ("90\\degree", "90^\\circ", W, C),
    # spaces in complex numbers
    ("6 - 5 i", "6-5i", W, C),
    ("3 + 4 i", "3+4i", W, C),
    # number bases never match across bases; a plain numeral is read in the reference's base
    ("52_9", "52_8", C, W),
    ("101_2", "5", W, C),
    # repeated list elements: a bare list is a multiset
    ("3, 5, 5, 7", "3, 5, 7", C, W),
    ("3,3,5", "3,5,5", C, W),
    # boxes with nothing math-verify can read but the raw string
    ("=", "5", W, F),
    (")(", "5", W, F),
    ("+", "5", W, F),
    # sentence punctuation inside the box
    ("5.", "5", W, C),
]

KEPT = [
    ("52_8", "52_8", C),
    ("52", "52_8", C),  # the question asked for base 8; the model left the subscript out
    ("52_{8}", "52_8", C),
    ("59_8", "52_8", W),  # 9 is no base-8 digit
    ("42", "52_8", W),
    ("7,5,3", "3, 5, 7", C),  # order of a bare list does not matter, as in v1
    ("5,3,3", "3,5,3", C),
    ("(2,12) \\cup (12,102)", "(2,12) \\cup (12,102)", C),  # a pair is not a thousands number
    ("(1,000)", "1000", W),  # nor is a pair in parentheses
    ("10,\\!080", "10080", C),
    ("\\text{(C)}", "C", C),
    ("\\{\\}", "\\emptyset", C),
    ("x", "x", C),
    ("\\frac{1}{3}", "0.33", W),
]


@pytest.mark.parametrize(("answer", "reference", "v1", "v2"), REVERSED)
def test_v2_reverses_these_v1_verdicts(answer, reference, v1, v2):
    assert judge(answer, reference) is v1
    assert judge_v2(answer, reference) is v2


@pytest.mark.parametrize(("answer", "reference", "outcome"), KEPT)
def test_v2_keeps_these(answer, reference, outcome):
    assert judge_v2(answer, reference) is outcome


def test_normalise():
    assert normalise("11,\\! 111,\\! 111,\\! 100") == "11111111100"
    assert normalise("90^{\\circ}") == "90^\\circ"
    assert normalise("\\sqrt{2} i.") == "\\sqrt{2}i"
    assert normalise("0.123 456") == "0.123 456"  # digits after a decimal point are not thousands


def test_math500_references_agree_with_v1():
    if not MATH500.exists():
        pytest.skip(f"{MATH500} not found")
    rows = [json.loads(line) for line in MATH500.read_text().splitlines()]
    answers = [r["answer"] for r in rows]
    assert [a for a in answers if judge_v2(a, a) is not C] == []
    # the next problem's answer: v2 agrees with v1 on every one of these non-matching pairs
    swapped = [(answers[(i + 1) % len(answers)], a) for i, a in enumerate(answers)]
    assert [p for p in swapped if judge_v2(*p) is not judge(*p)] == []


def test_v2_in_the_pool_and_in_process_is_recorded():
    completions = ["\\boxed{2\\,220}", "\\boxed{52_9}", "\\boxed{=}", "\\boxed{1}"]
    references = ["2220", "52_8", "5", "1"]
    with GraderPool(workers=1, timeout_s=5.0, grader="v2") as pool:
        grades = pool.grade_batch(completions, references, [False] * 4)
    assert [g.outcome for g in grades] == [C, W, F, C]
    assert {g.grader_version for g in grades} == {GRADER_VERSIONS["v2"]}
    assert [grade(c, r, False, grader="v2") for c, r in zip(completions, references)] == grades
    assert grade("\\boxed{2\\,220}", "2220", False).outcome is W  # v1 stays the default
