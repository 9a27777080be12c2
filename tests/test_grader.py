"""Grader v1: outcome rules, math-verify equivalence, and the isolated worker pool."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from rewards import grader
from rewards.grader import Grade, GraderPool, grade, judge
from rewards.outcome import GRADER_VERSION, Outcome

MATH500 = Path(__file__).resolve().parents[2] / "shared" / "data" / "math500.jsonl"
C, W, F, T, IND = (
    Outcome.CORRECT,
    Outcome.WRONG,
    Outcome.FORMAT_REJECTED,
    Outcome.TRUNCATED,
    Outcome.INDETERMINATE,
)


def _math500() -> list[dict]:
    if not MATH500.exists():
        pytest.skip(f"{MATH500} not found")
    return [json.loads(line) for line in MATH500.read_text().splitlines()]


def _completion(answer: str) -> str:
    return f"Let me think step by step. So the final answer is $\\boxed{{{answer}}}$."


def hooked_judge(answer: str, reference: str) -> Outcome:
    """Test-only judge run inside the workers: some answers make the worker misbehave on purpose."""
    if answer == "SLEEP":  # a slow but interruptible grader: the in-worker timer stops it
        time.sleep(60)
    if answer == "BLOCK":  # deaf to the timer, like a long C-level computation: the parent kills it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(60)
    if answer == "EXIT":
        os._exit(3)
    if answer == "SEGV":
        os.kill(os.getpid(), signal.SIGSEGV)
    if answer == "MEMORY":  # far beyond the pool's memory limit
        bytearray(8 << 30)
    if answer == "RAISE":
        raise RuntimeError("grader bug")
    return judge(answer, reference)


@pytest.fixture(scope="module")
def pool():
    with GraderPool(workers=2, timeout_s=2.0) as p:
        yield p


@pytest.fixture(scope="module")
def hooked_pool():
    with GraderPool(workers=2, timeout_s=1.0, memory_mb=512, judge=hooked_judge) as p:
        yield p


# --- outcome rules, in process ---------------------------------------------------------------------------


def test_precedence_truncated_first():
    assert grade(_completion("5"), "5", truncated=True) == Grade(T, "5", GRADER_VERSION)
    assert grade("no box and cut off", "5", truncated=True).outcome is T
    assert grade("\\boxed{}", "5", truncated=True).outcome is T


@pytest.mark.parametrize(
    ("completion", "outcome"),
    [
        ("The answer is 5.", F),  # no box
        ("\\boxed{5", F),  # no complete box
        ("\\boxed{}", F),  # empty
        ("\\boxed{   }", F),
        ("\\boxed{\\text{}}", F),  # math-verify extracts nothing from it
        ("\\boxed{$}", F),
        ("\\boxed{4} hmm, no: \\boxed{5}", C),  # the last box counts
        ("\\boxed{5} hmm, no: \\boxed{4}", W),
        ("\\boxed{5} and an unfinished \\boxed{4", C),  # the last COMPLETE box counts
    ],
)
def test_outcome_rules(completion, outcome):
    assert grade(completion, "5", truncated=False).outcome is outcome


def test_grade_records_answer_and_version():
    g = grade(_completion("\\frac{2}{4}"), "\\frac{1}{2}", truncated=False)
    assert g == Grade(C, "\\frac{2}{4}", GRADER_VERSION)
    assert grade("nothing", "1", truncated=False).answer is None


@pytest.mark.parametrize(
    ("reference", "answer"),
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\frac{1}{2}", "1/2"),
        ("\\frac{1}{2}", "\\dfrac12"),
        ("0.25", "\\frac{1}{4}"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
        ("[2,5)", "[2, 5)"),
        ("(-\\infty, 3]", "(-\\infty,3]"),
        ("(1,2)", "(1, 2)"),
        ("(3, -\\frac{1}{2})", "\\left(3, -0.5\\right)"),
        ("30^\\circ", "30"),
        ("30", "30^{\\circ}"),
        ("\\text{(C)}", "C"),
        ("\\text{(C)}", "(C)"),
        ("\\text{(C)}", "\\text{(C)}"),
        ("\\text{Evelyn}", "\\text{Evelyn}"),
        ("\\text{Evelyn}", "Evelyn"),
        ("\\text{even}", "\\text{even}"),
        ("\\{1,2\\}", "\\{2,1\\}"),
        ("x^2+1", "1+x^2"),
        ("3", "x=3"),
        ("10\\%", "10"),
        ("1,000", "1000"),
        ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ],
)
def test_equivalent_forms_are_correct(reference, answer):
    assert grade(_completion(answer), reference, truncated=False).outcome is C


@pytest.mark.parametrize(
    ("reference", "answer"),
    [
        ("\\frac{1}{2}", "\\frac{1}{3}"),
        ("\\frac{1}{3}", "0.33"),
        ("[2,5)", "(2,5)"),
        ("(1,2)", "(2,1)"),
        ("\\text{(C)}", "D"),
        ("\\text{even}", "\\text{odd}"),
        ("\\text{Evelyn}", "\\text{Bob}"),
        ("2\\sqrt{2}", "2\\sqrt{3}"),
        ("30^\\circ", "60^\\circ"),
        ("\\{1,2\\}", "\\{1,3\\}"),
    ],
)
def test_wrong_answers(reference, answer):
    assert grade(_completion(answer), reference, truncated=False).outcome is W


def test_grader_failure_is_indeterminate(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("math-verify bug")

    monkeypatch.setattr(grader.math_verify, "verify", broken)
    assert grade(_completion("5"), "5", truncated=False).outcome is IND


# --- MATH500 ----------------------------------------------------------------------------------------------


def test_every_math500_reference_grades_correct(pool):
    rows = _math500()
    grades = pool.grade_batch(
        [_completion(r["answer"]) for r in rows], [r["answer"] for r in rows], [False] * len(rows)
    )
    failed = [(r["unique_id"], r["answer"], g.outcome) for r, g in zip(rows, grades) if g.outcome is not C]
    assert not failed
    assert [g.answer for g in grades] == [r["answer"] for r in rows]


def test_outcomes_do_not_depend_on_worker_count(pool):
    rows = _math500()[:30]
    completions, references, truncated = [], [], []
    for i, row in enumerate(rows):
        other = rows[(i + 1) % len(rows)]["answer"]
        completions += [_completion(row["answer"]), _completion(other), row["solution"], "no box here"]
        references += [row["answer"]] * 4
        truncated += [False, False, False, i % 7 == 0]
    pooled = pool.grade_batch(completions, references, truncated)
    with GraderPool(workers=1, timeout_s=2.0) as single:
        assert single.grade_batch(completions, references, truncated) == pooled
    assert [grade(*args) for args in zip(completions, references, truncated)] == pooled
    assert {g.outcome for g in pooled} >= {C, W, F, T}


# --- isolation --------------------------------------------------------------------------------------------


def test_misbehaving_worker_only_loses_its_own_item(hooked_pool):
    answers = ["1", "SLEEP", "1", "EXIT", "2", "SEGV", "BLOCK", "MEMORY", "RAISE", "1", "\\frac{2}{2}"]
    grades = hooked_pool.grade_batch(
        [_completion(a) for a in answers], ["1"] * len(answers), [False] * len(answers)
    )
    assert [g.outcome for g in grades] == [C, IND, C, IND, W, IND, IND, IND, IND, C, C]
    assert [g.answer for g in grades] == answers
    # every worker that was killed or crashed has been replaced: the pool still grades correctly
    again = ["1", "2", "x=1", "\\frac{3}{3}", "(1)"]
    grades = hooked_pool.grade_batch(
        [_completion(a) for a in again], ["1"] * len(again), [False] * len(again)
    )
    assert [g.outcome for g in grades] == [C, W, C, C, C]


def test_truncated_and_unboxed_items_need_no_worker(hooked_pool):
    # "EXIT" would kill a worker; items decided without math-verify never reach one
    completions = ["cut off \\boxed{EXIT}", "no box", "\\boxed{}"]
    grades = hooked_pool.grade_batch(completions, ["1"] * 3, [True, False, False])
    assert [g.outcome for g in grades] == [T, F, F]


def _hostile(marker: Path) -> dict[str, str]:
    shell = f"__import__('os').system('touch {marker}')"
    return {
        "megabytes": "blah { \\frac{1}{2} " * 150_000 + "\\boxed{1}",  # 3 MB
        "nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
        "nested fractions": "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}",
        "exponent tower": "\\boxed{9^9^9^9^9}",
        "braced tower": "\\boxed{9^{9^{9^{9^{9}}}}}",
        "huge power": "\\boxed{10^{10^{10}}}",
        "long sum": "\\boxed{" + "1+" * 100_000 + "1}",
        "nul bytes": "\x00\\boxed{1\x002}\x00",
        "python in the box": f"\\boxed{{{shell}}}",
        "python as text": f"\\boxed{{\\text{{{shell}}}}} {shell}",
        "python eval": f"\\boxed{{eval(\"open('{marker}', 'w')\")}}",
    }


@pytest.mark.slow
def test_hostile_completions_are_contained(pool, tmp_path):
    marker = tmp_path / "pwned"
    for name, completion in _hostile(marker).items():
        pool.grade_batch(["\\boxed{1}"] * 2, ["1"] * 2, [False] * 2)  # workers killed earlier are back
        start = time.monotonic()
        [g] = pool.grade_batch([completion], ["1"], [False])
        elapsed = time.monotonic() - start
        assert elapsed < 2.0 + 1.0, f"{name}: {elapsed:.1f} s"
        assert g.outcome in (C, W, F, IND), name
    assert not marker.exists()
    assert [g.outcome for g in pool.grade_batch(["\\boxed{1}", "\\boxed{2}"], ["1", "1"], [False] * 2)] == [
        C,
        W,
    ]


def test_pool_argument_checks(pool):
    with pytest.raises(ValueError, match="differ in length"):
        pool.grade_batch(["\\boxed{1}"], ["1", "2"], [False])
    with pytest.raises(TypeError, match=r"references\[1\] is int"):
        pool.grade_batch(["\\boxed{1}"] * 2, ["1", 1], [False] * 2)
    with pytest.raises(ValueError, match="workers >= 1"):
        GraderPool(workers=0)
    with pytest.raises(ValueError, match="module-level"):
        GraderPool(judge=lambda answer, reference: C)
    closed = GraderPool(workers=1)
    closed.close()
    with pytest.raises(RuntimeError, match="closed"):
        closed.grade_batch(["\\boxed{1}"], ["1"], [False])


def test_default_pool_is_shared():
    assert grader.default_pool() is grader.default_pool()
    grades = grader.grade_batch(["\\boxed{0.5}", "\\boxed{2}"], ["\\frac12", "3"], [False, False])
    assert [g.outcome for g in grades] == [C, W]
