"""docs/experiment-real/: every number of its README recomputes from the committed rows, through the launcher's
report stage and docs/experiment-real/plan.yaml (launch/)."""

import json
import shutil
from pathlib import Path

import pytest

from analysis.compare import main as compare_main
from launch.base import at_cap, cell_tasks, choose
from launch.gpus import fitting
from launch.plan import load
from launch.report import Launch, arm_trajectory, primary, report
from rundir.archive import folders, read_bytes, unpack
from rundir.files import read_jsonl

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs/experiment-real"


PLAN = load(DOCS / "plan.yaml")


def _launch(where: Path) -> Launch:
    return Launch(PLAN, where)


def test_the_readme_tables_are_what_the_report_command_prints():
    readme = (DOCS / "README.md").read_text()
    block = readme.split("<!-- report -->\n", 1)[1].split("<!-- /report -->", 1)[0]
    assert block == report(PLAN)


def test_the_base_report_recomputes_from_its_rows_and_the_rule_gives_the_committed_choice():
    committed = json.loads((DOCS / "base/base_report.json").read_text())
    for cell in committed["cells"]:
        name = f"base_rows_{cell['family']}_{cell['prompt']}_T{cell['temperature']}.jsonl"
        rows = read_jsonl(DOCS / "base" / name)  # from base/rows.tar.xz
        assert [at_cap(rows, k["cap"]) for k in cell["caps"]] == cell["caps"]
    # the plan's grid is the one measured, and its rule gives the committed choice
    assert [(c["tasks"], c["prompt"], c["temperature"]) for c in PLAN.base_report.cells] == [
        (cell_tasks(c), c["prompt"], c["temperature"]) for c in committed["cells"]
    ]
    assert list(PLAN.base_report.caps) == [k["cap"] for k in committed["cells"][0]["caps"]]
    choice = json.loads((DOCS / "base/choice.json").read_text())
    chosen = choose(committed["cells"], PLAN.base_report.rule)
    assert chosen.pop("tasks") == choice.pop("family")
    assert chosen == {k: v for k, v in choice.items() if k != "snapshot_sha256"}


def test_every_run_started_after_the_plan_was_committed():
    plan_committed = (
        "2026-12-01T20:46:17Z"  # git log -1 --format=%cI -- docs/experiment-real/PLAN.md (cd2081e)
    )
    amendment = "2026-12-02T00:03:27Z"  # amendment 1 (9e99860), before launches 4 and 5
    amendment2 = "2026-12-02T02:58:34Z"  # amendment 2 (f172719), before launch 6
    amendment3 = "2026-12-02T05:31:27Z"  # amendment 3 (0bca07a), before launch 7
    runs = sorted(
        f / "run.json" for f in folders(DOCS) if f.parent.parent == DOCS and f.name.startswith("smollm2-S")
    )
    assert len(runs) == 12 + 12 + 2 + 12 + 1 + 12 + 12
    for path in runs:
        info = json.loads(read_bytes(path))  # published run.json files are in rows.tar.xz
        after = {"launch4": amendment, "solo": amendment, "launch6": amendment2, "launch7": amendment3}.get(
            path.parts[-3], plan_committed
        )
        assert info["started"] > after and info["code"]["commit"], path
        if path.parts[-3] == "launch7":  # run from the amendment's commit, and resumed from it
            assert info["code"]["commit"].startswith("0bca07a") and len(info["resumes"]) == 2, path


def test_launch4_evaluated_no_step_after_0_in_every_run():
    """What the README's 'no arm-level test' rests on: PLAN.md's deviation step for launch 4 is step 0."""
    assert _launch(DOCS / "launch4").common_step() == 0


def test_the_primary_block_is_analysis_compare_seed_level_test(tmp_path):
    """The code that reports PLAN.md's primary once a launch gets there, on six seed pairs that did (the embedded
    seeds6 runs, renamed as a launch's): its table is compare's, the same numbers as the published report."""
    seeds6, lx = REPO / "docs/experiment-embedded/seeds6", _launch(tmp_path)
    seeds6 = unpack(seeds6, tmp_path / "seeds6")  # rows out of rows.tar.xz
    for arm in PLAN.arms:
        for seed in PLAN.seeds:
            shutil.copytree(seeds6 / f"runs/{arm}-s{seed}", tmp_path / f"smollm2-{arm}-s{seed}")
    assert lx.common_step() == 10
    block = primary(lx)
    published = (seeds6 / "S2_vs_S0/report.md").read_text()
    row = next(line for line in published.splitlines() if line.startswith("| heldout300 (primary) |"))
    assert "step 10, PLAN.md's deviation step, seeds 0, 1, 2, 3, 4, 5" in block and row in block.splitlines()
    assert "Sensitivity" not in block  # no run failed there
    table = arm_trajectory(lx, "fixed32").splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == ["| 0", "| 5", "| 10"]


def test_launch6_leaves_the_failed_runs_seed_out_and_compares_at_step_20():
    """PLAN.md's rules on launch 6's rows: S0-s1 logged a NaN gradient norm at step 12 (a failed run), so seed 1's
    pair leaves the seed-level test; the other ten runs all evaluated step 20; all twelve, step 10."""
    launch = DOCS / "launch6"
    lx = _launch(launch)
    runs = sorted(lx.dir(arm, seed) for arm in PLAN.arms for seed in PLAN.seeds)
    assert len(runs) == 12 and [r.name for r in runs if lx.failed(r)] == ["smollm2-S0-s1"]
    assert lx.tested_seeds() == (0, 2, 3, 4, 5)
    assert lx.common_step((0, 2, 3, 4, 5)) == 20 and lx.common_step() == 10
    block = primary(lx)
    assert "### Primary: S2 − S0, heldout300, step 20, PLAN.md's deviation step, seeds 0, 2, 3, 4, 5" in block
    assert "### Sensitivity, every seed (not the primary): S2 − S0, heldout300, step 10" in block


def test_launch7_tests_every_seed_at_step_30_and_its_skipped_updates_are_not_failures():
    """PLAN.md amendment 3 on launch 7's rows: every run reached step 30; S2-s5's steps 11 and 12 had a NaN
    gradient norm with finite micro-batch losses and applied no update, so no run failed and all six seed
    pairs enter the primary at the plan's step 30 (no deviation, no sensitivity reading)."""
    launch = DOCS / "launch7"
    lx = _launch(launch)
    runs = [lx.dir(arm, seed) for arm in PLAN.arms for seed in PLAN.seeds]
    assert len(runs) == 12 and all(lx.started(r) for r in runs) and not any(lx.failed(r) for r in runs)
    assert lx.tested_seeds() == PLAN.seeds and lx.common_step() == 30
    rows = read_jsonl(launch / "smollm2-S2-s5/results/steps.jsonl")
    assert [r["step"] for r in rows if r["update_skipped"]] == [11, 12]
    assert all(r["nonfinite_losses"] == 0 for r in rows)
    block = primary(lx)
    assert block.startswith("### Primary: S2 − S0, heldout300, step 30, seeds 0, 1, 2, 3, 4, 5\n")
    assert "Sensitivity" not in block


@pytest.mark.parametrize(
    ("launch", "seeds", "step"), [("launch6", (0, 2, 3, 4, 5), 20), ("launch7", range(6), 30)]
)
def test_a_launch_primary_report_recomputes(tmp_path, launch, seeds, step):
    launch = DOCS / launch
    a, b = (",".join(str(launch / f"smollm2-{arm}-s{s}") for s in seeds) for arm in ("S2", "S0"))
    assert compare_main([a, b, "--a-step", str(step), "--b-step", str(step), "--out", str(tmp_path)]) == 0

    def tables(text: str) -> list[str]:  # every table row but where the runs were (an absolute path)
        return [
            line for line in text.splitlines() if line.startswith("|") and "| run directory |" not in line
        ]

    assert tables((tmp_path / "report.md").read_text()) == tables((launch / "S2_vs_S0/report.md").read_text())


def test_the_seed0_comparison_recomputes(tmp_path):
    a, b = DOCS / "runs/smollm2-S2-s0", DOCS / "runs/smollm2-S0-s0"
    assert compare_main([str(a), str(b), "--a-step", "10", "--b-step", "10", "--out", str(tmp_path)]) == 0

    def tables(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(("| heldout300", "| fixed32", "| B "))]

    assert tables((tmp_path / "report.md").read_text()) == tables((DOCS / "seed0/report.md").read_text())


def test_runs_at_a_time_fit_the_gpu_at_the_leaders_measured_memory(monkeypatch):
    import launch.gpus as gpus

    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: (9000.0, 143771.0))
    assert fitting(12, 1) == 12  # 0.9 x 143771 / 9000 = 14.4: all twelve fit
    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: (15000.0, 143771.0))
    assert fitting(12, 1) == 8
    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: (200000.0, 143771.0))
    assert fitting(12, 1) == 1  # never none
    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: None)  # no nvidia-smi: as asked
    assert fitting(5, 1) == 5
    # docs/experiment-qwen launch 1: the leader held 14,778 MiB at its first step, its runs 27 GiB later
    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: (14778.0, 143771.0))
    assert fitting(6, 1) == 6 and fitting(6, 1, growth=1.9) == 4


def test_the_decomposition_of_launch7s_lead_adds_up_to_it_and_is_what_issue_45_read():
    """The pre-registered split (launch/report.py `decomposition`) on launch 7 at step 30: the net per cause adds up
    to S2 − S0 on heldout300 counted from the scores; no pair goes from S0 truncated to S2 correct, and about three
    quarters of the +2.4 pp lead come from S0 format-rejected (issue 45)."""
    from launch.report import decomposition, peak
    from rundir.files import Run

    lx = _launch(DOCS / "launch7")
    table = {
        row.split(" | ")[0][2:]: row.split(" | ")[1:]
        for row in decomposition(lx).splitlines()
        if row.startswith("| ")
    }
    net = {cause: float(table[cause][2].rstrip(" |")) for cause in ("truncated", "format_rejected", "wrong")}
    correct = {
        a: sum(Run(lx.dir(a, s)).score(30, "heldout300").rate("correct") for s in PLAN.seeds)
        for a in PLAN.arms
    }
    assert sum(net.values()) == pytest.approx(
        100 * (correct["S2"] - correct["S0"]) / len(PLAN.seeds), abs=0.02
    )
    assert table["truncated"][:2] == ["0", "0"] and 0.7 < net["format_rejected"] / sum(net.values()) < 0.8
    declines = [row.split(" | ")[-1] for row in peak(lx).splitlines() if row.startswith(("| S0", "| S2"))]
    assert declines == ["+0.0 |", "+0.0 |"]  # neither arm declines from a peak by step 30
