"""Each step's row says where the grader failed: the pool's per-batch reports summed over the step's rounds."""

import pytest
from scripted import TextGrader, generate, make_trainer, tiny_random_model

from rewards.grader import BatchReport


class TimingOutGrader(TextGrader):
    """TextGrader whose every batch reports one timeout and 2.5 s of worker time lost to it."""

    def grade_batch(self, completions, references, truncated):
        self.last_report = BatchReport(
            items=len(completions), sent=len(completions), timeouts=1, seconds_lost=2.5
        )
        return super().grade_batch(completions, references, truncated)


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model()


def test_grader_failures_and_lost_time_are_summed_over_the_rounds(tiny, tmp_path, monkeypatch):
    script = {"p0": "CTTT", "p1": "CWWW", "p2": "CTCT", "p3": "CCWW"}  # S2 needs two rounds of 2 problems
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "S2", script, problems_per_round=2)
    trainer.outcome_reward.pool = TimingOutGrader()
    generate(trainer)
    record = trainer.step_record
    assert record.groups["rounds"] == 2
    assert record.grader["timeouts"] == 2 and record.grader["items"] == 2 * 2 * 4
    assert record.seconds["grade_lost"] == pytest.approx(5.0)
    assert "seconds" not in record.grader and "seconds_lost" not in record.grader  # timings live in seconds
