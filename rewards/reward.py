"""The outcome reward as a TRL reward function (SPEC §3: correct = 1, other gradeable outcomes = 0).

An indeterminate rollout gets `None`: TRL's `GRPOTrainer._calculate_rewards` turns None into NaN and the
group baseline uses nanmean / nanstd, so the rollout is left out of its group's mean and std.
"""

from collections.abc import Sequence

from rewards.grader import BatchReport, Grade, GraderPool, default_pool
from rewards.outcome import Outcome, reward_of


def completion_text(completion) -> str:
    """A plain-text completion as is; a conversational one (list of messages): its last assistant message."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # multimodal content blocks: keep the text parts
                return "".join(block.get("text", "") for block in content if block.get("type") == "text")
            return content or ""
    return ""


class OutcomeReward:
    """Callable reward function for `GRPOTrainer(reward_funcs=[OutcomeReward(...)])`.

    A completion is truncated iff its token ids are empty or do not end with an EOS id (TRL keeps the
    EOS token in `completion_ids`). The reference answer comes from the dataset column `answer`.
    `grade` returns the grade of every completion (what the trainer's selection keeps); after each call
    `last_report` holds the pool's `BatchReport` (grader time lost to timeouts, items past the batch
    deadline, ...) for logging.
    """

    __name__ = "outcome_reward"

    def __init__(self, eos_token_ids: Sequence[int], pool: GraderPool | None = None):
        if not eos_token_ids:
            raise ValueError("OutcomeReward needs at least one EOS token id to tell truncated rollouts apart")
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self.pool = pool
        self.last_report = BatchReport()

    def __call__(self, prompts, completions, completion_ids, answer, **kwargs) -> list[float | None]:
        grades = self.grade(completions, completion_ids, answer)
        return [None if g.outcome is Outcome.INDETERMINATE else reward_of(g.outcome) for g in grades]

    def grade(self, completions, completion_ids, answer) -> list[Grade]:
        """One grade per completion, in order; the pool's report of the batch goes to `last_report`."""
        if not (len(completions) == len(completion_ids) == len(answer)):
            raise ValueError(
                f"outcome_reward: completions, completion_ids and answer differ in length "
                f"({len(completions)}, {len(completion_ids)}, {len(answer)})"
            )
        truncated = [len(ids) == 0 or int(ids[-1]) not in self.eos_token_ids for ids in completion_ids]
        pool = self.pool or default_pool()
        grades = pool.grade_batch([completion_text(c) for c in completions], list(answer), truncated)
        self.last_report = pool.last_report
        return grades
