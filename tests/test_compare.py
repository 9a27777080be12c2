"""Arm comparison on small synthetic run directories whose numbers can be worked out by hand."""

import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from scipy.stats import permutation_test

from analysis.compare import (
    CompareError,
    Comparison,
    compare_runs,
    load_run,
    load_side,
    main,
    peak_decline,
    trajectory,
)
from analysis.plots import PLOTS, break_gaps, figures, lead_split_figure
from analysis.report import headline_notes
from analysis.stats import fixed_sequence_holm
from rewards.outcome import Outcome
from rundir.files import RunFileError

C, W, T, F, N = "correct", "wrong", "truncated", "format_rejected", "indeterminate"
REPO = Path(__file__).resolve().parents[1]

# Set "h": one sample per problem; set "f": two samples per problem.
A_LAST = {"h": [[C], [C], [C], [W], [T], [C]], "f": [[C, C], [W, C], [T, N], [N, C]]}
B_LAST = {"h": [[T], [F], [C], [C], [T], [W]], "f": [[C, W], [C, C], [C, C], [C, N]]}


def write_run(
    root: Path,
    arm: str,
    evals: dict,
    *,
    n_steps: int = 3,
    ids=None,
    grader: str = "grader-test",
    seed: int = 0,
    config: dict | None = None,
    train_steps=None,
) -> Path:
    """A run directory per docs/CONTRACTS.md. evals: {step: {set: [[outcome per sample] per problem]}};
    task i of a set is f"{set}-{i}" unless ids gives the lists. config: fields over the default recipe."""
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
        "config": {
            "arm": arm,
            "seed": seed,
            "output_dir": str(root),
            "learning_rate": 5e-5,
            **(config or {}),
        },
    }
    (root / "run.json").write_text(json.dumps(meta))
    steps = [
        {"step": s, "logprob_median": -0.25 + 0.01 * s, "gate_stat": 0.1 * s}
        for s in (train_steps if train_steps is not None else range(1, n_steps + 1))
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
    assert (f.accuracy_a.outcomes[Outcome.INDETERMINATE], f.accuracy_a.graded) == (2, 6)
    assert (f.accuracy_a.accuracy, f.accuracy_b.accuracy) == (4 / 6, 6 / 7)
    # Disagreements count the pairs the test uses: the 3 pairs with an indeterminate are left out of both.
    assert c.disagreements["f"] == {(W, C): 1, (C, W): 1, (C, T): 1}
    assert (f.pairs, f.pairs_dropped, h.pairs, h.pairs_dropped) == (5, 3, 6, 0)
    # One sample per problem: the totals and the test's differences are the same pairs.
    gains = sum(v for (ob, oa), v in c.disagreements["h"].items() if oa == C)
    losses = sum(v for (ob, oa), v in c.disagreements["h"].items() if ob == C)
    assert sum(h.diffs_pp) / 100 == gains - losses == 2
    report = c.report.read_text()
    assert (
        "**f**: over the 5 sample pairs graded in both arms (the pairs the test uses; 3 with an indeterminate "
        "left out), 3 differ; A correct where B is not: 1; B correct where A is not: 2. 1 − 2 = -1 is the sum "
        "over the pairs of (A correct − B correct): -20.0 pp of the 5 pairs; the paired difference, a mean over "
        "problems of per-problem means, is -33.3 pp (problems keep different numbers of pairs)." in report
    )
    assert (
        "2 is the sum over the pairs of (A correct − B correct): +33.3 pp of the 6 pairs, the paired difference as well"
        in report
    )
    assert "| B indeterminate" not in report and "→ A indeterminate" not in report


def test_headline_says_when_own_denominators_and_paired_mean_differ(runs, tmp_path):
    c = compare_runs(*runs, tmp_path / "out")
    f, h = c.paired["f"], c.paired["h"]
    # f: A 4/6, B 6/7 on their own denominators (−19.0 pp); over the shared pairs A 50.0%, B 83.3%.
    assert f.own_diff_pp == pytest.approx(100 * (4 / 6 - 6 / 7))
    assert (f.paired_a, f.paired_b) == pytest.approx((0.5, 5 / 6))
    assert f.denominators_differ and not h.denominators_differ
    # over the 5 pairs themselves: A correct in 3 (60.0%), B in 4 (80.0%): not the per-problem means
    assert (f.pair_share_a, f.pair_share_b) == pytest.approx((3 / 5, 4 / 5))
    notes = headline_notes(c)
    assert notes[0] == (
        "**f**: the accuracies above use each arm's own denominator and differ by -19.0 pp. The paired "
        "difference uses the 5 sample pairs graded in both arms (3 problems): the mean over problems of each "
        "problem's share correct among its pairs is A 50.0%, B 83.3%, -33.3 pp (as shares of the pairs "
        "themselves, A / B = 60.0% / 80.0%)."
    )
    assert "3 sample pair(s) indeterminate in A or B left out" in notes[1]
    assert not any(n.startswith("**h**") for n in notes)
    assert notes[0] in c.report.read_text()


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
    assert "A − B paired (pp)" in printed and "+33.3" in printed and "-33.3" in printed
    report = (out / "report.md").read_text()
    for text in (str(runs[0]), str(runs[1]), "S2", "S0", "grader-test", "step 2", "step 3", "sign-flip"):
        assert text in report
    assert "| B truncated → A correct | 1 |" in report
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == len(PLOTS)
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
    with pytest.raises(RunFileError, match=r"step 7 was not evaluated \(no results/eval_step007.jsonl\)"):
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
        RunFileError, match=rf"eval_step002.jsonl:{len(lines) + 1}: duplicate row .* task h-0, sample 0"
    ):
        compare_runs(*runs, tmp_path / "out")


def test_refuses_duplicate_training_steps(runs, tmp_path):
    path = runs[1] / "results" / "steps.jsonl"
    path.write_text(path.read_text() + json.dumps({"step": 2, "logprob_median": 0, "gate_stat": 0}) + "\n")
    with pytest.raises(RunFileError, match=r"steps.jsonl:4: duplicate row for step 2"):
        compare_runs(*runs, tmp_path / "out")


def test_refuses_rows_that_do_not_match_run_json(runs, tmp_path):
    path = runs[1] / "results" / "eval_step003.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if (r["task_id"], r["sample"]) != ("f-2", 1)))
    with pytest.raises(
        RunFileError,
        match=r"set f does not hold run.json's 4 task ids × 2 .* 1 missing \(e.g. task f-2 sample 1\)",
    ):
        compare_runs(*runs, tmp_path / "out")


def test_refuses_unknown_outcome(runs, tmp_path):
    path = runs[0] / "results" / "eval_step002.jsonl"
    path.write_text(path.read_text().replace('"outcome": "wrong"', '"outcome": "timeout"', 1))
    with pytest.raises(RunFileError, match=r"eval_step002.jsonl:4: unknown outcome 'timeout'"):
        compare_runs(*runs, tmp_path / "out")


# --- one run of an arm with itself ------------------------------------------------------------------
def test_a_run_compared_with_itself_is_warned(runs, tmp_path, capsys):
    c = compare_runs(runs[0], runs[0], tmp_path / "out")
    assert all(d.test.p_value == 1 for d in c.paired.values())
    assert c.warnings[0].startswith(f"A and B are the same run ({runs[0]}) at the same step 2")
    assert "> **Warning:** A and B are the same run" in c.report.read_text()
    assert main([str(runs[0]), str(runs[0]), "--b-step", "0", "--out", str(tmp_path / "o")]) == 0
    assert "warning: A and B are the same run" in capsys.readouterr().err
    assert (
        "at steps 2 and 0: this compares two steps of one run" in (tmp_path / "o" / "report.md").read_text()
    )


# --- Holm and the primary comparison ------------------------------------------------------------------
def test_report_names_the_primary_and_adjusts_for_multiplicity(tmp_path):
    rng = random.Random(3)
    evals_a = {0: _random_evals(rng, 0.4), 4: _random_evals(rng, 0.9)}
    evals_b = {0: evals_a[0], 4: _random_evals(rng, 0.3)}
    a = write_run(tmp_path / "A", "S2", evals_a, ids=MS_IDS)
    b = write_run(tmp_path / "B", "S0", evals_b, ids=MS_IDS)
    c = compare_runs(a, b, tmp_path / "out", n_resamples=2000)
    assert list(c.paired) == ["heldout300", "fixed32"] and c.primary == "heldout300"
    fam = c.family()
    assert [name for name, *_ in fam][:2] == ["A − B, heldout300", "A − B, fixed32"] and len(fam) == 6
    expected = fixed_sequence_holm([p for _, p, _ in fam])
    cells = c.adjusted_cells()
    for (name, *_), (adj, _) in zip(fam, expected):
        assert float(cells[name].removeprefix("≤ ")) >= adj  # rounded up, never below
        assert float(cells[name].removeprefix("≤ ")) == pytest.approx(adj, rel=0.01)
        assert adj >= fam[0][1]  # nothing passes where the primary did not
    report = c.report.read_text()
    assert "**Primary comparison: heldout300, A at step 4 against B at step 4**" in report
    assert "| heldout300 (primary) |" in report and "p adjusted (6 tests)" in report
    assert "One training seed per arm: no arm-level test is possible" in report
    assert "seeds per arm for 80% power" not in report


def test_adjusted_cells_are_rounded_up_and_marked_where_they_rest_on_monte_carlo():
    class Family:  # the primary exact, one Monte Carlo at its floor (2 / 1001), one exact
        seed_level = {}

        def family(self):
            return [("x", 0.0123456, "exact"), ("y", 2 / 1001, "monte_carlo"), ("z", 0.5, "exact")]

    # fixed sequence: x at 0.0123456; then Holm over y, z: 2 × 0.001998 = 0.003996 -> raised to x; 0.5
    assert Comparison.adjusted_cells(Family()) == {"x": "0.01235", "y": "0.01235", "z": "0.5"}

    class Later(Family):
        def family(self):
            return [("x", 0.001, "exact"), ("y", 2 / 1001, "monte_carlo"), ("z", 0.2, "exact")]

    # y: 2 × 0.001998 = 0.003996, a Monte Carlo value: "≤" and two digits rounded up
    assert Comparison.adjusted_cells(Later()) == {"x": "0.001", "y": "≤ 0.004", "z": "0.2"}


# --- several training seeds per arm --------------------------------------------------------------------
MS_IDS = {"heldout300": [f"h{i:02d}" for i in range(12)], "fixed32": [f"f{i}" for i in range(4)]}


def _random_evals(rng: random.Random, skill: float, indeterminate: float = 0.05) -> dict:
    def outcome():
        u = rng.random()
        return N if u < indeterminate else C if u < indeterminate + skill else rng.choice([W, T, F])

    return {
        "heldout300": [[outcome()] for _ in range(12)],
        "fixed32": [[outcome(), outcome()] for _ in range(4)],
    }


@pytest.fixture
def seeded(tmp_path):
    """Arms S2 and S0, three training seeds each, shared base evaluation at step 0, compared at step 4."""
    rng = random.Random(11)
    base = _random_evals(rng, 0.4)
    outcomes = {}
    for arm, skill in (("S2", 0.65), ("S0", 0.4)):
        for s in range(3):
            outcomes[arm, s] = {0: base, 2: _random_evals(rng, skill + 0.1), 4: _random_evals(rng, skill)}
            write_run(tmp_path / f"{arm}-s{s}", arm, outcomes[arm, s], ids=MS_IDS, seed=s)
    return tmp_path, outcomes


def _scipy_paired_p(x, y) -> float:
    res = permutation_test(
        (np.asarray(x), np.asarray(y)),
        lambda a, b, axis: np.mean(a - b, axis=axis),
        permutation_type="samples",
        alternative="two-sided",
        n_resamples=np.inf,
        vectorized=True,
    )
    return float(res.pvalue)


def test_pooled_test_against_scipy_on_several_seeds(seeded):
    root, outcomes = seeded
    c = compare_runs(
        f"{root}/S2-s0,{root}/S2-s1,{root}/S2-s2", str(root / "S0-s*"), root / "out", n_resamples=2000
    )
    assert c.n_seeds == 3 and c.a.seeds == c.b.seeds == [0, 1, 2] and (c.step_a, c.step_b) == (4, 4)
    for name in ("heldout300", "fixed32"):
        # Independently: per problem, the mean over seeds and samples of A correct and of B correct,
        # over the (seed, sample) pairs with no indeterminate in either arm.
        x, y, per_seed = [], [], []
        for t in range(len(MS_IDS[name])):
            kept = [
                (oa == C, ob == C)
                for s in range(3)
                for oa, ob in zip(outcomes["S2", s][4][name][t], outcomes["S0", s][4][name][t])
                if N not in (oa, ob)
            ]
            if kept:
                x.append(np.mean([k[0] for k in kept]))
                y.append(np.mean([k[1] for k in kept]))
        for s in range(3):
            d = [
                np.mean([(oa == C) - (ob == C) for oa, ob in zip(pa, pb) if N not in (oa, ob)])
                for pa, pb in zip(outcomes["S2", s][4][name], outcomes["S0", s][4][name])
                if any(N not in pair for pair in zip(pa, pb))
            ]
            per_seed.append(100 * np.mean(d))
        d = c.paired[name]
        assert d.test.method == "exact" and d.test.n == len(x)
        assert d.test.mean_diff == pytest.approx(100 * np.mean(np.subtract(x, y)))
        assert d.test.p_value == pytest.approx(_scipy_paired_p(x, y), abs=1e-12)
        assert [ps[name].test.mean_diff for _, ps in c.per_seed] == pytest.approx(per_seed)
        level = c.seed_level[name]
        assert level.diffs_pp == pytest.approx(per_seed)
        assert level.sd == pytest.approx(statistics.stdev(per_seed))
        assert level.a_ahead == sum(v > 0 for v in per_seed)
        # the seed-level test: exact sign-flip over the 3 per-seed differences, against scipy's
        assert level.test.p_value == pytest.approx(_scipy_paired_p(per_seed, [0.0] * 3), abs=1e-12)
        assert level.test.p_value >= 0.25  # 3 seeds: 2 / 2^3 is the smallest possible
    report = c.report.read_text()
    assert "3 training seeds per arm" in report and "## Per seed" in report
    # the report leads with the seed-level test; the problem-level test is named for what it covers
    seed_at = report.index("## Seed-level test: the training run as the unit")
    assert seed_at < report.index("## Problem-level test, given these checkpoints")
    assert "A at step 4 against B at step 4, the seed-level test**" in report
    assert "with 3 seeds the smallest possible two-sided p is 2 / 2^3 = 0.25: below 6 seeds" in report
    assert c.family()[0][0] == "seeds, A − B, heldout300"
    assert "- **heldout300**: seeds per arm for 80% power (two-sided α = 0.05)" in report
    assert "band" in report.lower()


def test_pooled_decline_picks_the_peak_on_pooled_accuracy(seeded):
    root, outcomes = seeded
    c = compare_runs(str(root / "S2-s*"), str(root / "S0-s*"), root / "out", n_resamples=500)
    pd = c.peaks["A"]["heldout300"]
    assert pd.steps == [0, 2, 4]
    graded = {
        s: sum(o != N for r in range(3) for p in outcomes["S2", r][s]["heldout300"] for o in p)
        for s in pd.steps
    }
    correct = {
        s: sum(o == C for r in range(3) for p in outcomes["S2", r][s]["heldout300"] for o in p)
        for s in pd.steps
    }
    acc = {s: correct[s] / graded[s] for s in pd.steps}
    assert pd.test.accuracy == pytest.approx([acc[s] for s in pd.steps])
    assert pd.peak_step == max(pd.steps, key=lambda s: (acc[s], -s))


def test_cli_takes_lists_and_globs(seeded, capsys):
    root, _ = seeded
    out = root / "cli"
    assert (
        main(
            [
                f"{root}/S2-s0,{root}/S2-s1,{root}/S2-s2",
                f"{root}/S0-s*",
                "--out",
                str(out),
                "--resamples",
                "500",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "A: S2 step 4 (3 seeds)" in printed and "A − B per seed (pp; seeds 0, 1, 2)" in printed
    assert printed.index("exact sign-flip over 3 seeds") < printed.index("given these checkpoints")
    assert "seeds per arm for 80% power" in printed
    assert (out / "report.md").is_file()
    assert main([f"{root}/S2-s*", f"{root}/S9-s*", "--out", str(out)]) == 2
    assert "matches no run directory" in capsys.readouterr().err


def test_refuses_seeds_that_do_not_pair(seeded):
    root, _ = seeded
    with pytest.raises(
        CompareError, match=r"same training seeds .* A \(S2\) has \[0, 1, 2\], B \(S0\) has \[0, 1\]"
    ):
        compare_runs(str(root / "S2-s*"), f"{root}/S0-s0,{root}/S0-s1", root / "out")
    with pytest.raises(CompareError, match=r"S2-s1 is listed twice"):
        compare_runs(f"{root}/S2-s1,{root}/S2-s*", str(root / "S0-s*"), root / "out")
    with pytest.raises(CompareError, match=r"A mixes arms S0, S2"):
        compare_runs(f"{root}/S2-s0,{root}/S0-s1", str(root / "S0-s*"), root / "out")


def test_refuses_a_repeated_training_seed(seeded):
    root, outcomes = seeded
    write_run(root / "S2-again", "S2", outcomes["S2", 1], ids=MS_IDS, seed=1)
    with pytest.raises(CompareError, match=r"A: training seed 1 appears twice: .*S2-s1 and .*S2-again"):
        compare_runs(f"{root}/S2-s*,{root}/S2-again", str(root / "S0-s*"), root / "out")


def test_refuses_a_seed_with_other_eval_sets(seeded):
    root, outcomes = seeded
    ids = {**MS_IDS, "heldout300": [*MS_IDS["heldout300"][:-1], "other"]}
    write_run(root / "S0-x2", "S0", outcomes["S0", 2], ids=ids, seed=2)
    with pytest.raises(
        CompareError, match=r"set heldout300: task ids differ between runs: 1 only in .*S2-s0"
    ):
        compare_runs(str(root / "S2-s*"), f"{root}/S0-s0,{root}/S0-s1,{root}/S0-x2", root / "out")


def test_refuses_recipes_that_differ_beyond_seed_and_arm(seeded):
    root, outcomes = seeded
    write_run(root / "S0-lr", "S0", outcomes["S0", 2], ids=MS_IDS, seed=2, config={"learning_rate": 1e-4})
    b = f"{root}/S0-s0,{root}/S0-s1,{root}/S0-lr"
    with pytest.raises(CompareError, match=r"learning_rate: 5e-05 in .*S0-s0; 0\.0001 in .*S0-lr") as e:
        compare_runs(str(root / "S2-s*"), b, root / "out")
    assert "--allow-recipe-difference" in str(e.value)
    c = compare_runs(str(root / "S2-s*"), b, root / "out", allow_recipe=("learning_rate",), n_resamples=200)
    assert any(w.startswith("recipes differ (allowed): learning_rate: 5e-05 in") for w in c.warnings)
    # An arm's own fields may differ between the arms, not between the seeds of one arm.
    write_run(root / "S2-g", "S2", outcomes["S2", 2], ids=MS_IDS, seed=2, config={"groups_per_step": 8})
    with pytest.raises(CompareError, match=r"groups_per_step: null in .*S2-s0; 8 in .*S2-g"):
        compare_runs(f"{root}/S2-s0,{root}/S2-s1,{root}/S2-g", str(root / "S0-s*"), root / "out")
    g = write_run(root / "solo-S2", "S2", outcomes["S2", 0], ids=MS_IDS, config={"groups_per_step": 8})
    assert compare_runs(g, root / "S0-s0", root / "out", n_resamples=200).warnings == []


# --- plots ---------------------------------------------------------------------------------------------
def test_rate_axes_are_scaled_to_their_data(tmp_path):
    # truncated shares of 5-20 % (issue 28: they were drawn on 0-100 %, and the arms' lines overlapped)
    def rates(k: int) -> dict:
        return {"h": [[T]] * k + [[C]] * (20 - k)}

    a = write_run(tmp_path / "A", "S2", {0: rates(1), 1: rates(3), 2: rates(4)})
    b = write_run(tmp_path / "B", "S0", {0: rates(1), 1: rates(2), 2: rates(2)})
    sa, sb = load_side("A", a, None), load_side("B", b, None)
    figs = figures([trajectory(sa), trajectory(sb)], ["h"])
    lo, hi = figs["Truncation and format-rejection rates per eval step"].axes[0].get_ylim()
    assert -1 <= lo <= 0 and 20 <= hi < 30
    lo, hi = figs["Accuracy per eval step"].axes[0].get_ylim()
    assert 70 < lo <= 80 and 95 <= hi <= 101
    for fig in figs.values():
        plt.close(fig)


def test_gaps_in_steps_jsonl_break_the_line():
    x, y = break_gaps([1, 2, 4, 5], [0.1, 0.2, 0.4, 0.5])
    assert (
        x.tolist() == [1, 2, 3, 4, 5] and np.isnan(y[2]) and y[[0, 1, 3, 4]].tolist() == [0.1, 0.2, 0.4, 0.5]
    )


def test_plots_break_at_missing_rows_and_draw_seed_bands(seeded):
    root, outcomes = seeded
    gap = write_run(root / "gap", "S2", outcomes["S2", 0], ids=MS_IDS, train_steps=[1, 2, 4])
    side = load_side("A", gap, None)
    figs = figures([trajectory(side)], ["heldout300", "fixed32"])
    line = figs["Median sampled-token logprob per training step"].axes[0].lines[0]
    assert np.isnan(line.get_ydata()[2]) and line.get_xdata()[2] == 3  # no straight line from 2 to 4
    banded = figures([trajectory(load_side("A", str(root / "S2-s*"), None))], ["heldout300", "fixed32"])
    ax = banded["Accuracy per eval step"].axes[0]
    assert len(ax.collections) == 1 and "mean of 3 seeds" in ax.get_legend_handles_labels()[1][0]
    seed_lines = [ln for ln in ax.lines if ln.get_gid() == "seed"]
    assert len(seed_lines) == 3  # each seed a thin line under the mean
    mean_line = next(ln for ln in ax.lines if ln.get_label().endswith("(mean of 3 seeds)"))
    per_seed = np.array([ln.get_ydata() for ln in seed_lines])
    assert mean_line.get_ydata() == pytest.approx(per_seed.mean(0))
    assert max(ln.get_linewidth() for ln in seed_lines) < mean_line.get_linewidth()
    for fig in [*figs.values(), *banded.values()]:
        plt.close(fig)


def test_the_lead_split_figure_draws_each_seeds_parts_and_their_sum():
    parts = {"either unresolved": [6.7, -0.3, 9.3], "both finished": [-4.0, 1.0, 1.0]}
    fig = lead_split_figure((0, 1, 100), parts, "t")
    ax = fig.axes[0]
    bars = [(round(b.get_x() + b.get_width() / 2, 6), b.get_height()) for b in ax.patches]
    assert [h for _, h in bars] == parts["either unresolved"] + parts["both finished"]
    assert [x for x, _ in bars[:3]] < [x for x, _ in bars[3:]]  # side by side, the first part left
    (ticks,) = [ln for ln in ax.lines if ln.get_label().startswith("sum")]
    assert ticks.get_ydata() == pytest.approx([2.7, 0.7, 10.3])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "100"]
    labels = ax.get_legend_handles_labels()[1]
    assert "either unresolved (mean +5.2)" in labels and "sum (mean +4.6)" in labels
    plt.close(fig)


def test_a_step_zero_only_run_draws_sane_axes(tmp_path):
    evals = {0: {"h": [[C], [W], [C]]}}
    a = write_run(tmp_path / "A", "S2", evals, train_steps=[])
    b = write_run(tmp_path / "B", "S0", evals, train_steps=[])
    c = compare_runs(a, b, tmp_path / "out")
    assert (c.step_a, c.step_b) == (0, 0) and len(c.plots) == len(PLOTS)
    figs = figures([trajectory(c.a), trajectory(c.b)], ["h"])
    acc = figs["Accuracy per eval step"].axes[0]
    lo, hi = acc.get_xlim()
    assert lo <= -1 and hi >= 1 and list(acc.get_xticks()) == [0]
    ylo, yhi = acc.get_ylim()
    assert -1 <= ylo < 200 / 3 < yhi <= 101  # around the one value (2 of 3 correct), inside 0-100 %
    logp = figs["Median sampled-token logprob per training step"].axes[0]
    assert [t.get_text() for t in logp.texts] == ["no training steps logged"]
    for fig in figs.values():
        plt.close(fig)


def test_thread_and_grader_counts_are_where_a_run_ran_not_its_recipe(seeded):
    """cpu_threads and grader_workers change no row (tests/test_cpu_generation.py, the grader is deterministic):
    runs at other counts compare without --allow-recipe-difference and without a warning."""
    root, outcomes = seeded
    write_run(root / "S0-t2", "S0", outcomes["S0", 2], ids=MS_IDS, seed=2,
              config={"cpu_threads": 2, "grader_workers": 4})  # fmt: skip
    c = compare_runs(
        str(root / "S2-s*"), f"{root}/S0-s0,{root}/S0-s1,{root}/S0-t2", root / "out", n_resamples=200
    )
    assert c.warnings == []


def test_the_analysis_package_reads_top_to_bottom():
    """No import cycle among analysis/ modules, TYPE_CHECKING imports included (issue 44: compare.py and
    report.py imported each other)."""
    import ast

    package = Path(__file__).resolve().parent.parent / "analysis"
    graph = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        graph[path.stem] = {
            node.module.split(".")[1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("analysis.")
        }

    def reaches(start, goal, seen=()):
        return any(
            n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph.get(start, ())
        )

    assert graph["report"] and graph["compare"]
    assert [m for m in graph if reaches(m, m)] == []


def test_pass_and_maj_at_k_paired_by_problem(tmp_path):
    """Issue 47: sets with ≥ 2 samples per problem get pass@j / maj@k per arm, A − B paired by problem."""
    a = write_run(tmp_path / "A", "S2", {2: {"f": [[C, C], [W, C], [C, W], [W, W]], "h": [[C], [W]]}})
    b = write_run(tmp_path / "B", "S0", {2: {"f": [[W, W], [W, C], [W, W], [C, W]], "h": [[W], [W]]}})
    c = compare_runs(a, b, tmp_path / "out")
    assert "h" not in c.at_k and [r.metric for r in c.at_k["f"]] == ["pass@1", "pass@2", "maj@2"]
    got = {r.metric: (r.a.value, r.b.value, r.test.mean_diff, r.test.p_value) for r in c.at_k["f"]}
    # pass@2 per problem: A 1, 1, 1, 0; B 0, 1, 0, 1 → diffs 1, 0, 1, -1: of the 8 sign patterns of the
    # three non-zero ones, 4 reach a sum ≥ 1 and 4 ≤ -1 → p = 1.
    assert got["pass@2"] == pytest.approx((0.75, 0.5, 0.25, 1.0))
    # pass@1: A 1, ½, ½, 0; B 0, ½, 0, ½. Every answer is "1", so maj@2 scores its share of correct rows.
    assert got["pass@1"][:3] == pytest.approx((0.5, 0.25, 0.25)) and got["maj@2"] == got["pass@1"]
    text = c.report.read_text()
    assert "## pass@k and maj@k, given these checkpoints" in text
    assert "| f | pass@2 | 75.0% [" in text and "| +25.0 pp | 1 |" in text
