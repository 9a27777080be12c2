"""bench/resume_check.py --compare: two runs that already ran (rows copied off a lent machine), compared row by
row with timings and the grader pool's bookkeeping aside, eval row by eval row, weights when a stepNNN/ is kept."""

import json

from bench.resume_check import compare


def run(root, name, loss=0.5, recycled=0, seconds=1.0, completion="a"):
    d = root / name
    (d / "results").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"launch": {"num_processes": 1}}))
    row = {"step": 1, "sampler": {"position": 3}, "task_ids_trained": ["t1"], "outcomes_sampled": {"correct": 2},
           "loss": loss, "grader": {"recycled": recycled}, "seconds": {"generate": seconds}}  # fmt: skip
    (d / "results/steps.jsonl").write_text(json.dumps(row) + "\n")
    ev = {"step": 1, "set": "s", "task_id": "t1", "sample": 0, "seed": 9, "completion": completion}
    (d / "results/eval_step001.jsonl").write_text(json.dumps(ev) + "\n")
    return d


def test_identical_runs_compare_equal_whatever_their_timings_and_grader_recycling(tmp_path):
    a, b = run(tmp_path, "a"), run(tmp_path, "b", recycled=1, seconds=2.0)
    found = compare(a, b, tmp_path / "found.json")
    assert found["rows_identical"] and found["eval_rows_identical"] and found["eval_seeds_equal"]
    assert found["max_weight_diff"] is None  # no stepNNN/ kept
    assert json.loads((tmp_path / "found.json").read_text())["rows_identical"] is True


def test_a_loss_or_a_completion_that_differs_is_found(tmp_path):
    a = run(tmp_path, "a")
    assert not compare(a, run(tmp_path, "b", loss=0.5000001), None)["rows_identical"]
    assert not compare(a, run(tmp_path, "c", completion="b"), None)["eval_rows_identical"]


def test_published_runs_compare_from_their_archive(tmp_path):
    from rundir import archive

    run(tmp_path, "a")
    run(tmp_path, "b", recycled=1)
    archive.pack(tmp_path)  # run.json and rows into rows.tar.xz, as docs/performance/ keeps them
    assert not (tmp_path / "a" / "run.json").exists()
    found = compare(tmp_path / "a", tmp_path / "b", None)
    assert found["rows_identical"] and found["eval_rows_identical"] and found["eval_files"] == 1
