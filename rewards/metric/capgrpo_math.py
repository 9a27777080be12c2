"""`evaluate` metric for capgrpo's graders: accuracy over gradeable samples and the mix of outcomes.

Load it offline with `evaluate.load("<repo>/rewards/metric/capgrpo_math.py")`.
"""

import datasets
import evaluate

from rewards.grader import grade_batch
from rewards.outcome import Outcome, grader_version

_DESCRIPTION = """Grades model completions against reference answers with capgrpo's grader v1 or v2 (the last complete
\\boxed{...} compared with math-verify, in isolated worker processes). accuracy = correct / (all samples that are
not indeterminate); indeterminate samples (grader timeout or crash) are counted but never in a denominator."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: completions (str).
    references: reference answers, the bare content of the reference \\boxed{} (str).
    truncated: optional keyword of `compute`, one bool per completion: it hit the token cap (no EOS).
        Default: none truncated.
    grader: optional keyword of `compute`, "v1" (default: math-verify's verdicts) or "v2".
Returns:
    accuracy: correct / non-indeterminate samples (NaN when there are none).
    n: number of samples; gradeable: non-indeterminate samples.
    one count per outcome (truncated, format_rejected, correct, wrong, indeterminate).
    grader_version: the grader version string.
"""


class CapgrpoMath(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references, truncated=None, grader="v1"):
        if truncated is None:
            truncated = [False] * len(predictions)
        elif len(truncated) != len(predictions):
            raise ValueError(
                f"capgrpo_math: {len(truncated)} truncated flags for {len(predictions)} predictions"
            )
        version = grader_version(grader)  # refuses an unknown grader before any work
        grades = grade_batch(predictions, references, truncated, grader=grader)
        counts = {outcome.value: 0 for outcome in Outcome}
        for g in grades:
            counts[g.outcome.value] += 1
        gradeable = len(grades) - counts[Outcome.INDETERMINATE]
        accuracy = counts[Outcome.CORRECT] / gradeable if gradeable else float("nan")
        return {
            "accuracy": accuracy,
            "n": len(grades),
            "gradeable": gradeable,
            **counts,
            "grader_version": version,
        }
