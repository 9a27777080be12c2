"""Arm comparison on small synthetic run directories whose numbers can be worked out by hand."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.compare import CompareError, compare_runs, load_run, main, peak_decline
from rewards.outcome import Outcome

C, W, T, F, N = "correct", "wrong", "truncated", "format_rejected", "indeterminate"
REPO = Path(__file__).resolve().parents[1]

# Set "h": one sample per problem; set "f": two samples per problem.
A_LAST = {"h": [[C], [C], [C], [W], [T], [C]], "f": [[C, C], [W, C], [T, N], [N, C]]}
B_LAST = {"h": [[T], [F], [C], [C], [T], [W]], "f": [[C, W], [C, C], [C, C], [C, N]]}


def write_run(
    root: Path, arm: str, evals: dict, *, n_steps: int = 3, ids=None, grader: str = "grader-test"
) -> Path:
    """A run directory per docs/CONTRACTS.md. evals: {step: {set: [[outcome per sample] per problem]}};
    task i of a set is f"{set}-{i}" unless ids gives the lists."""
    results = root / "results"
    results.mkdir(parents=True)
    layout = next(iter(evals.values()))
    ids = ids or {name: [f"{name}-{i}" for i in range(len(p))] for name, p in layout.items()}
    meta = {
        "arm": arm,
        "policy_id": f"policy-{arm}",
        "gate": "v1",
        "groups_per_step": 4,
        "grader_version": grader,
        "base_model": "tiny",
        "eval_sets": ids,
        "eval": {
            "cap": 64,
            "temperature": 1.0,
            "top_p": 1.0,
            "seed": 1,
            "samples": {n: len(p[0]) for n, p in layout.items()},
        },
    }
    (root / "run.json").write_text(json.dumps(meta))
    steps = [
        {"step": s, "logprob_median": -0.25 + 0.01 * s, "gate_stat": 0.1 * s} for s in range(1, n_steps + 1)
    ]
    (results / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    for step, sets in evals.items():
        rows = [
            {"step": step, "set": name, "task_id": ids[name][t], "sample": i, "seed": 100 * t + i,
             "outcome": outcome, "answer": "1", "reference": "1", "completion_tokens": 10 * step + t,
             "cap": 64, "completion": "..."}
            for name, problems in sets.items() for t, outcomes in enumerate(problems)
            for i, outcome in enumerate(outcomes)
        ]  # fmt: skip
        (results / f"eval_step{step:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture
def runs(tmp_path):
    base = {"h": [[W], [W], [C], [C], [W], [W]], "f": [[C, W], [W, W], [C, C], [W, C]]}
    a = write_run(tmp_path / "A", "S2", {0: base, 2: A_LAST})
    b = write_run(tmp_path / "B", "S0", {0: base, 3: B_LAST})
    return a, b


def test_paired_differences_and_disagreements(runs, tmp_path):
    c = compare_runs(*runs, tmp_path / "out")
    assert (c.step_a, c.step_b) == (2, 3)  # last evaluated step of each run

    h = c.paired["h"]
    assert h.diffs_pp == [100, 100, 0, -100, 0, 100]
    assert (h.accuracy_a.accuracy, h.accuracy_b.accuracy) == (4 / 6, 2 / 6)
    assert h.test.mean_diff == pytest.approx(100 / 3)
    assert h.test.p_value == pytest.approx(10 / 16)  # non-zero +1 +1 −1 +1: 5 of 16 patterns sum >= 2
    assert c.disagreements["h"] == {(T, C): 1, (F, C): 1, (C, W): 1, (W, C): 1}

    # Per problem, over samples graded in both: +50, −50, −100 (sample 1 indeterminate in A); the last
    # problem has no sample graded in both and is dropped.
    f = c.paired["f"]
    assert f.diffs_pp == [50, -50, -100] and f.n_dropped == 1
    assert f.test.mean_diff == pytest.approx(-100 / 3)
    assert f.test.p_value == pytest.approx(2 * 3 / 8)  # sums <= −100: 3 of the 8 patterns of ±50 ±50 ±100
    assert (f.accuracy_a.counts[Outcome.INDETERMINATE], f.accuracy_a.graded) == (2, 6)
    assert (f.accuracy_a.accuracy, f.accuracy_b.accuracy) == (4 / 6, 6 / 7)
    assert c.disagreements["f"] == {(W, C): 1, (C, W): 1, (C, T): 1, (C, N): 2, (N, C): 1}


def test_explicit_steps(runs, tmp_path):
    c = compare_runs(*runs, tmp_path / "out", step_a=0, step_b=0)
    assert (c.step_a, c.step_b) == (0, 0)
    assert all(d.test.mean_diff == 0 and d.test.p_value == 1 for d in c.paired.values())
    assert not c.disagreements["h"] and not c.disagreements["f"]


def test_peak_and_decline(tmp_path):
    trajectory = {
        0: {"h": [[W], [W], [C], [C], [W], [W]]},  # 2/6
        10: {"h": [[C], [C], [C], [C], [C], [W]]},  # 5/6: the peak
        20: {"h": [[C], [W], [T], [C], [C], [W]]},  # 3/6
    }
    run = load_run(write_run(tmp_path / "R", "S0", trajectory))
    pd = peak_decline(run, "h", 20, n_resamples=1000, seed=0)
    assert (pd.peak_step, pd.step) == (10, 20)
    assert pd.change.diffs_pp == [0, -100, -100, 0, 0, 0]
    assert pd.change.test.mean_diff == pytest.approx(-100 / 3)
    assert pd.change.test.p_value == pytest.approx(2 * 1 / 4)  # −1 −1: one of 4 patterns sums <= −2
    at_peak = peak_decline(run, "h", 10, n_resamples=1000, seed=0)
    assert (at_peak.peak_step, at_peak.change.test.mean_diff, at_peak.change.test.p_value) == (10, 0, 1)


def test_peak_ties_go_to_the_earliest_step(tmp_path):
    evals = {0: {"h": [[C], [W]]}, 5: {"h": [[W], [C]]}, 9: {"h": [[W], [W]]}}
    run = load_run(write_run(tmp_path / "R", "S0", evals))
    assert peak_decline(run, "h", 9, n_resamples=100, seed=0).peak_step == 0


def test_cli_writes_report_and_plots(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main([str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "A − B (pp)" in printed and "+33.3" in printed and "-33.3" in printed
    report = (out / "report.md").read_text()
    for text in (str(runs[0]), str(runs[1]), "S2", "S0", "grader-test", "step 2", "step 3", "sign-flip"):
        assert text in report
    assert "| B truncated → A correct | 1 |" in report
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 5
    for png in pngs:
        assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
        assert f"]({png.name})" in report


def test_module_cli_default_out_dir(runs, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "analysis.compare", str(runs[0]), str(runs[1]), "--b-step", "0"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "comparisons" / "S2_vs_S0" / "report.md").stat().st_size > 0
    assert "B: S0 step 0" in proc.stdout


def test_warns_on_different_grader_and_tolerates_null_logprob(tmp_path):
    a = write_run(tmp_path / "A", "S2", {4: A_LAST})
    b = write_run(tmp_path / "B", "S0", {4: B_LAST}, grader="grader-other")
    steps = b / "results" / "steps.jsonl"
    steps.write_text(
        steps.read_text() + json.dumps({"step": 4, "logprob_median": None, "gate_stat": 0.5}) + "\n"
    )
    c = compare_runs(a, b, tmp_path / "out")
    assert c.warnings == ["grader versions differ: grader-test (A) vs grader-other (B)"]
    report = c.report.read_text()
    assert "> **Warning:** grader versions differ" in report and "`policy-S0`" in report


# --- refusals ---------------------------------------------------------------------------------------
def test_refuses_missing_step(runs, tmp_path, capsys):
    with pytest.raises(CompareError, match=r"step 7 was not evaluated \(no results/eval_step007.jsonl\)"):
        compare_runs(*runs, tmp_path / "out", step_a=7)
    assert main([str(runs[0]), str(runs[1]), "--b-step", "5", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"run {runs[1]}: step 5 was not evaluated" in err and "evaluated steps: 0, 3" in err


def test_refuses_different_eval_sets(runs, tmp_path):
    b = write_run(tmp_path / "B1", "S0", {3: {"h": B_LAST["h"]}})
    with pytest.raises(
        CompareError, match=r"eval sets differ: run .*A has \['f', 'h'\], run .*B1 has \['h'\]"
    ):
        compare_runs(runs[0], b, tmp_path / "out")


def test_refuses_different_task_ids(runs, tmp_path):
    ids = {"h": [f"h-{i}" for i in range(6)], "f": ["f-0", "f-1", "f-2", "other"]}
    b = write_run(tmp_path / "B1", "S0", {3: B_LAST}, ids=ids)
    with pytest.raises(
        CompareError, match=r"set f: task ids differ between runs: 1 only in .*\['f-3'\], 1 only in"
    ):
        compare_runs(runs[0], b, tmp_path / "out")


def test_refuses_different_samples_per_problem(runs, tmp_path):
    b = write_run(tmp_path / "B1", "S0", {3: {"h": B_LAST["h"], "f": [[C, W, C]] * 4}})
    with pytest.raises(CompareError, match=r"set f: samples per problem differ: 2 in run .*A, 3 in run .*B1"):
        compare_runs(runs[0], b, tmp_path / "out")


def test_refuses_duplicate_eval_rows(runs, tmp_path):
    path = runs[0] / "results" / "eval_step002.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines) + lines[0])
    with pytest.raises(
        CompareError, match=rf"eval_step002.jsonl:{len(lines) + 1}: duplicate row .* task h-0, sample 0"
    ):
        compare_runs(*runs, tmp_path / "out")


def test_refuses_duplicate_training_steps(runs, tmp_path):
    path = runs[1] / "results" / "steps.jsonl"
    path.write_text(path.read_text() + json.dumps({"step": 2, "logprob_median": 0, "gate_stat": 0}) + "\n")
    with pytest.raises(CompareError, match=r"steps.jsonl:4: duplicate row for step 2"):
        compare_runs(*runs, tmp_path / "out")


def test_refuses_rows_that_do_not_match_run_json(runs, tmp_path):
    path = runs[1] / "results" / "eval_step003.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if (r["task_id"], r["sample"]) != ("f-2", 1)))
    with pytest.raises(
        CompareError,
        match=r"set f does not hold run.json's 4 task ids × 2 .* 1 missing \(e.g. task f-2 sample 1\)",
    ):
        compare_runs(*runs, tmp_path / "out")


def test_refuses_unknown_outcome(runs, tmp_path):
    path = runs[0] / "results" / "eval_step002.jsonl"
    path.write_text(path.read_text().replace('"outcome": "wrong"', '"outcome": "timeout"', 1))
    with pytest.raises(CompareError, match=r"eval_step002.jsonl:4: unknown outcome 'timeout'"):
        compare_runs(*runs, tmp_path / "out")
