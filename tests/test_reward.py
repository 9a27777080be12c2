"""OutcomeReward: TRL's reward-function signature, truncation from token ids, None for indeterminate."""

import os

import pytest

from rewards.grader import GraderPool, judge
from rewards.outcome import Outcome
from rewards.reward import OutcomeReward, completion_text

EOS, OTHER_EOS, TOKEN = 2, 7, 11


def crashing_judge(answer: str, reference: str) -> Outcome:
    """Test-only judge: the worker dies on the answer "CRASH"."""
    if answer == "CRASH":
        os._exit(1)
    return judge(answer, reference)


@pytest.fixture(scope="module")
def pool():
    with GraderPool(workers=1, timeout_s=2.0, judge=crashing_judge) as p:
        yield p


def test_rewards_and_truncation_from_token_ids(pool):
    reward = OutcomeReward([EOS, OTHER_EOS], pool=pool)
    completions = [
        "\\boxed{4}",
        "\\boxed{5}",
        "no box",
        "\\boxed{4}",
        "\\boxed{4}",
        "\\boxed{4}",
        "\\boxed{CRASH}",
    ]
    completion_ids = [
        [TOKEN, EOS],
        [TOKEN, OTHER_EOS],
        [TOKEN, EOS],
        [TOKEN, TOKEN],  # hit the cap: no EOS at the end
        [],  # nothing generated: no EOS either
        [EOS, TOKEN],  # an EOS that is not the last token does not end the rollout
        [TOKEN, EOS],
    ]
    rewards = reward(
        prompts=["p"] * 7, completions=completions, completion_ids=completion_ids, answer=["4"] * 7
    )
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, None]
    assert [g.outcome for g in reward.grade(completions, completion_ids, ["4"] * 7)] == [
        Outcome.CORRECT,
        Outcome.WRONG,
        Outcome.FORMAT_REJECTED,
        Outcome.TRUNCATED,
        Outcome.TRUNCATED,
        Outcome.TRUNCATED,
        Outcome.INDETERMINATE,
    ]


def test_conversational_completions_use_the_last_assistant_message(pool):
    reward = OutcomeReward([EOS], pool=pool)
    completions = [
        [
            {"role": "assistant", "content": "\\boxed{1}"},
            {"role": "assistant", "content": "\\boxed{\\frac{6}{2}}"},
        ],
        [
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "so \\boxed"}, {"type": "text", "text": "{3}"}],
            }
        ],
        [{"role": "assistant", "content": "\\boxed{3}"}, {"role": "tool", "content": "\\boxed{1}"}],
        [{"role": "user", "content": "\\boxed{3}"}],
    ]
    rewards = reward(prompts=[[]] * 4, completions=completions, completion_ids=[[EOS]] * 4, answer=["3"] * 4)
    assert rewards == [1.0, 1.0, 1.0, 0.0]
    assert completion_text(completions[0]) == "\\boxed{\\frac{6}{2}}"
    assert reward.grade(completions, [[EOS]] * 4, ["3"] * 4)[3].outcome is Outcome.FORMAT_REJECTED


def test_trl_sees_the_name_and_the_none(pool):
    from trl.trainer.utils import (
        get_callable_name,
    )  # here, so that the workers importing this module skip trl

    reward = OutcomeReward([EOS], pool=pool)
    assert get_callable_name(reward) == "outcome_reward"
    [value] = reward(prompts=["p"], completions=["\\boxed{CRASH}"], completion_ids=[[EOS]], answer=["1"])
    assert value is None  # TRL maps None to NaN, which nanmean / nanstd leave out of the group baseline
    assert reward.last_report.crashes == 1 and reward.last_report.indeterminate == 1  # for the step's log


def test_bad_arguments(pool):
    with pytest.raises(ValueError, match="EOS"):
        OutcomeReward([], pool=pool)
    with pytest.raises(ValueError, match="differ in length"):
        OutcomeReward([EOS], pool=pool)(prompts=["p"], completions=["x"], completion_ids=[[EOS]], answer=[])
