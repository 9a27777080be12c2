"""The five rollout outcomes of grader v1 (SPEC §2) and the reward they carry."""

from enum import StrEnum
from importlib.metadata import version

GRADER_VERSION = f"capgrpo-grader-v1+math-verify-{version('math-verify')}"


class Outcome(StrEnum):
    TRUNCATED = "truncated"  # hit the token cap (no EOS), whatever the text says
    FORMAT_REJECTED = "format_rejected"  # ended, but no gradeable final \boxed{}
    CORRECT = "correct"
    WRONG = "wrong"  # "completed wrong": the last \boxed{} parses and is not equivalent
    INDETERMINATE = "indeterminate"  # the grader failed; never a sample, never in a denominator


UNRESOLVED = frozenset({Outcome.TRUNCATED, Outcome.FORMAT_REJECTED})


def reward_of(outcome: Outcome) -> float:
    """1 for correct, 0 for any other gradeable outcome, NaN for indeterminate (excluded from the baseline)."""
    if outcome is Outcome.INDETERMINATE:
        return float("nan")
    return 1.0 if outcome is Outcome.CORRECT else 0.0
