"""Graders v1 and v2 (SPEC §2): outcomes, boxed-answer extraction, the isolated grading pool, the TRL reward."""

from rewards.boxed import last_boxed
from rewards.grader import BatchReport, Grade, GraderPool, default_pool, grade, grade_batch, judge
from rewards.outcome import GRADER_VERSION, GRADER_VERSIONS, UNRESOLVED, Outcome, grader_version, reward_of
from rewards.reward import OutcomeReward, completion_text

__all__ = [
    "GRADER_VERSION",
    "GRADER_VERSIONS",
    "UNRESOLVED",
    "BatchReport",
    "Grade",
    "GraderPool",
    "Outcome",
    "OutcomeReward",
    "completion_text",
    "default_pool",
    "grade",
    "grade_batch",
    "grader_version",
    "judge",
    "last_boxed",
    "reward_of",
]
