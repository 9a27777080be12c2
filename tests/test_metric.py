"""The `evaluate` metric loads offline from its local path and counts outcomes as grader v1 defines them."""

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import evaluate  # noqa: E402
import pytest  # noqa: E402

from rewards.grader import Grade  # noqa: E402
from rewards.outcome import GRADER_VERSION, Outcome  # noqa: E402

METRIC = Path(__file__).resolve().parents[1] / "rewards" / "metric" / "capgrpo_math.py"


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(METRIC))


def test_accuracy_and_outcome_mix(metric):
    predictions = ["\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "\\boxed{3}", "no box", "\\boxed{0.5}"]
    result = metric.compute(predictions=predictions, references=["1/2"] * 5, truncated=[False] * 4 + [True])
    assert result == {
        "accuracy": 2 / 5,
        "n": 5,
        "gradeable": 5,
        "truncated": 1,
        "format_rejected": 1,
        "correct": 2,
        "wrong": 1,
        "indeterminate": 0,
        "grader_version": GRADER_VERSION,
    }
    assert metric.compute(predictions=["\\boxed{1}"], references=["1"])["accuracy"] == 1.0


def test_indeterminate_is_out_of_the_denominator(metric, monkeypatch):
    outcomes = [Outcome.CORRECT, Outcome.INDETERMINATE, Outcome.WRONG, Outcome.INDETERMINATE]

    def fake_grade_batch(completions, references, truncated, grader="v1"):
        return [Grade(o, None) for o in outcomes]

    monkeypatch.setattr(sys.modules[type(metric).__module__], "grade_batch", fake_grade_batch)
    result = metric.compute(predictions=["x"] * 4, references=["1"] * 4)
    assert (result["accuracy"], result["gradeable"], result["indeterminate"]) == (0.5, 2, 2)


def test_truncated_flags_must_match(metric):
    with pytest.raises(ValueError, match="truncated flags"):
        metric.compute(predictions=["\\boxed{1}"], references=["1"], truncated=[True, False])


def test_grader_v2_is_selectable_and_recorded(metric):
    from rewards.outcome import GRADER_VERSIONS

    result = metric.compute(predictions=["\\boxed{2\\,220}"], references=["2220"], grader="v2")
    assert (result["accuracy"], result["grader_version"]) == (1.0, GRADER_VERSIONS["v2"])
    assert metric.compute(predictions=["\\boxed{2\\,220}"], references=["2220"])["accuracy"] == 0.0  # v1
    with pytest.raises(ValueError, match="unknown grader 'v9'"):
        metric.compute(predictions=["\\boxed{1}"], references=["1"], grader="v9")
