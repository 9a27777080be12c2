"""Grader v1 (SPEC §2): outcomes, boxed-answer extraction, the isolated grading pool and the TRL reward."""

from rewards.boxed import last_boxed
from rewards.grader import Grade, GraderPool, default_pool, grade, grade_batch, judge
from rewards.outcome import GRADER_VERSION, UNRESOLVED, Outcome, reward_of
from rewards.reward import OutcomeReward, completion_text

__all__ = [
    "GRADER_VERSION",
    "UNRESOLVED",
    "Grade",
    "GraderPool",
    "Outcome",
    "OutcomeReward",
    "completion_text",
    "default_pool",
    "grade",
    "grade_batch",
    "judge",
    "last_boxed",
    "reward_of",
]
