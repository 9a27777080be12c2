"""rundir.files: the one reader of a run directory (names, rows, accuracy per set and step)."""

import json

import pytest

from rundir.files import Run, RunFileError, SetScore, eval_path, summarize, write_eval


def _rows(step: int, cap: int, outcomes: list[str], name: str = "heldout300") -> list[dict]:
    return [
        {"step": step, "set": name, "task_id": f"t{i}", "sample": 0, "seed": i, "outcome": o, "answer": "1",
         "reference": "1", "completion_tokens": 10 + i, "cap": cap, "completion": "..."}
        for i, o in enumerate(outcomes)
    ]  # fmt: skip


@pytest.fixture
def run_dir(tmp_path):
    meta = {"arm": "S2", "policy_id": "p", "gate": "v1", "grader_version": "g", "eval": {"cap": 64}}
    (tmp_path / "run.json").write_text(json.dumps(meta))
    for step, outcomes in {0: ["wrong", "wrong"], 2: ["correct", "wrong"], 4: ["wrong", "correct"]}.items():
        write_eval(tmp_path, step, _rows(step, 64, outcomes))
    write_eval(tmp_path, 4, _rows(4, 128, ["correct", "correct"]), cap_suffix=128)
    for d in ("step002", "step004", "state004"):
        (tmp_path / d).mkdir()
    return tmp_path


def test_scores_are_keyed_by_step_and_cap(run_dir):
    run = Run(run_dir)
    assert sorted(run.eval_files) == [(0, 64), (2, 64), (4, 64), (4, 128)]
    assert run.evaluated() == [0, 2, 4] and run.evaluated(128) == [4]
    assert run.score(4, "heldout300").accuracy == 0.5 and run.score(4, "heldout300", 128).accuracy == 1.0
    assert (run.saved, run.states, run.resumable) == ([2, 4], [4], [4])


def test_best_step_is_the_earliest_of_ties_at_the_run_cap(run_dir):
    # steps 2 and 4 tie at 50%; the 100% of step 4 is at another cap and does not count
    assert Run(run_dir).best_step("heldout300") == {"set": "heldout300", "step": 2, "accuracy": 0.5}


def test_indeterminate_leaves_the_denominator_and_summaries_say_none_when_nothing_is_graded():
    score = SetScore.of(
        ["correct", "indeterminate", "wrong", "truncated"], ["a", "a", "b", "b"], [1, 2, 3, 4]
    )
    assert (score.n, score.graded, score.accuracy, score.samples) == (4, 3, 1 / 3, 2)
    assert summarize(_rows(0, 64, ["indeterminate"]))["heldout300"]["accuracy"] is None
    with pytest.raises(ValueError):
        SetScore.of(["timeout"])


def test_rows_that_disagree_with_their_file_name_are_refused(run_dir):
    path = eval_path(run_dir, 2)
    path.write_text(path.read_text().replace('"cap": 64', '"cap": 65', 1))
    with pytest.raises(RunFileError, match=r"eval_step002.jsonl:1: row step/cap 2/65 disagree"):
        Run(run_dir).scores  # noqa: B018
    (run_dir / "results" / "eval_step0002.jsonl").write_text("")
    with pytest.raises(RunFileError, match="two eval files for step 2 at cap 64"):
        Run(run_dir)
