"""The five rollout outcomes (SPEC §2), the reward they carry, and the grader versions that assign them."""

from enum import StrEnum
from importlib.metadata import version

_MATH_VERIFY = version("math-verify")
# v1 is the seed's grader (math-verify's verdicts); v2 adds the normalisations of rewards.v2.
GRADER_VERSIONS = {name: f"capgrpo-grader-{name}+math-verify-{_MATH_VERIFY}" for name in ("v1", "v2")}
GRADER_VERSION = GRADER_VERSIONS["v1"]


def grader_version(grader: str) -> str:
    """The version string recorded in artifacts for grader `grader` ("v1" or "v2")."""
    if grader not in GRADER_VERSIONS:
        raise ValueError(f"unknown grader {grader!r}; known: {sorted(GRADER_VERSIONS)}")
    return GRADER_VERSIONS[grader]


def grader_name(version_string: str) -> str:
    """Inverse of `grader_version`: "v2" for "capgrpo-grader-v2+math-verify-0.9.0"."""
    name = version_string.removeprefix("capgrpo-grader-").split("+", 1)[0]
    if name not in GRADER_VERSIONS:
        raise ValueError(f"grader version {version_string!r} names no known grader")
    return name


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
