"""`make regrade`: a run's eval files re-graded into new files, with what changed."""

import json

import pytest

from rewards.grader import GraderPool
from rewards.outcome import GRADER_VERSIONS
from rundir.regrade import format_summary, main, regrade


def _row(step, set_name, task, sample, outcome, completion, reference):
    return {
        "step": step,
        "set": set_name,
        "task_id": task,
        "sample": sample,
        "seed": 7,
        "outcome": outcome,
        "answer": None,
        "reference": reference,
        "completion_tokens": 10,
        "cap": 64,
        "completion": completion,
    }


@pytest.fixture
def run(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    files = {
        "eval_step000.jsonl": [
            _row(0, "fixed32", "a", 0, "wrong", "so \\boxed{2\\,220}", "2220"),  # v2: correct
            _row(0, "fixed32", "a", 1, "correct", "\\boxed{52_9}", "52_8"),  # v2: wrong
            _row(0, "heldout300", "b", 0, "truncated", "\\boxed{1", "1"),  # stays truncated
            _row(0, "heldout300", "c", 0, "correct", "\\boxed{3}", "3"),
        ],
        "eval_step010_cap0032.jsonl": [
            _row(10, "fixed32", "a", 0, "wrong", "\\boxed{=}", "5"),  # v2: format_rejected
        ],
    }
    for name, rows in files.items():
        (results / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (results / "steps.jsonl").write_text("{}\n")
    config = {"grader_workers": 1, "grader_timeout_s": 3.0, "grader_memory_mb": 512, "seed": 0}
    (tmp_path / "run.json").write_text(json.dumps({"config": config}))
    return tmp_path


@pytest.fixture(scope="module")
def pool():
    with GraderPool(workers=1, grader="v2") as p:
        yield p


def test_regrade_writes_new_files_and_counts_changes(run, pool):
    before = {p.name: p.read_bytes() for p in (run / "results").iterdir()}
    summary = regrade(run, "v2", pool=pool)
    assert {p.name: p.read_bytes() for p in (run / "results").iterdir() if p.is_file()} == before
    out = run / "results" / "regrade-v2"
    assert sorted(p.name for p in out.iterdir()) == [
        "eval_step000.jsonl",
        "eval_step010_cap0032.jsonl",
        "summary.json",
    ]
    rows = [json.loads(line) for line in (out / "eval_step000.jsonl").read_text().splitlines()]
    assert [r["outcome"] for r in rows] == ["correct", "wrong", "truncated", "correct"]
    assert {r["grader_version"] for r in rows} == {GRADER_VERSIONS["v2"]}
    assert rows[0]["answer"] == "2\\,220" and rows[0]["seed"] == 7
    assert summary["changed"] == 3 and summary["rows"] == 5
    assert {(t["old"], t["new"]): t["n"] for t in summary["transitions"]} == {
        ("wrong", "correct"): 1,
        ("correct", "wrong"): 1,
        ("wrong", "format_rejected"): 1,
    }
    fixed0 = next(
        a for a in summary["accuracy"] if a["file"] == "eval_step000.jsonl" and a["set"] == "fixed32"
    )
    assert (fixed0["old"], fixed0["new"], fixed0["changed"]) == (0.5, 0.5, 2)
    assert json.loads((out / "summary.json").read_text()) == summary
    table = format_summary(summary)
    assert "| wrong | correct | 1 |" in table and "| 010_cap0032 | fixed32 | 1 |" in table


def test_regrade_never_overwrites(run, pool):
    regrade(run, "v2", pool=pool)
    with pytest.raises(FileExistsError, match="regrade-v2 exists"):
        regrade(run, "v2", pool=pool)


def test_cli_prints_the_table_and_refuses_bad_input(run, tmp_path, capsys):
    assert main([str(run), "--grader", "v1"]) == 0
    printed = capsys.readouterr().out
    assert "outcomes changed: 0 of 5" in printed and "regrade-v1" in printed
    assert "(workers=1, timeout_s=3.0, memory_mb=512: the run's)" in printed  # only the grader changes
    assert main([str(run), "--grader", "v3"]) == 2
    assert "unknown grader 'v3'" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing")]) == 2
    assert "no eval_stepNNN.jsonl" in capsys.readouterr().err
