"""docs/experiment-real/: every number of its README recomputes from the committed rows."""

import json
import shutil
from pathlib import Path

import pytest

from analysis.compare import main as compare_main
from rundir.archive import unpack
from rundir.files import read_jsonl

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs/experiment-real"


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("real_experiment", REPO / "bench/real_experiment.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_tables_are_what_the_report_command_prints():
    readme = (DOCS / "README.md").read_text()
    block = readme.split("<!-- report -->\n", 1)[1].split("<!-- /report -->", 1)[0]
    assert block == _bench().report(DOCS)


def test_the_base_report_recomputes_from_its_rows_and_the_rule_gives_the_committed_choice():
    bench = _bench()
    report = json.loads((DOCS / "base/base_report.json").read_text())
    for cell in report["cells"]:
        name = f"base_rows_{cell['family']}_{cell['prompt']}_T{cell['temperature']}.jsonl"
        rows = read_jsonl(DOCS / "base" / name)  # from base/rows.tar.xz
        assert [bench.at_cap(rows, k["cap"]) for k in cell["caps"]] == cell["caps"]
    choice = json.loads((DOCS / "base/choice.json").read_text())
    assert bench.choose(report["cells"]) == {k: v for k, v in choice.items() if k != "snapshot_sha256"}


def test_every_run_started_after_the_plan_was_committed():
    plan_committed = (
        "2026-12-01T20:46:17Z"  # git log -1 --format=%cI -- docs/experiment-real/PLAN.md (cd2081e)
    )
    amendment = "2026-12-02T00:03:27Z"  # amendment 1 (9e99860), before launches 4 and 5
    amendment2 = "2026-12-02T02:58:34Z"  # amendment 2 (f172719), before launch 6
    amendment3 = "2026-12-02T05:31:27Z"  # amendment 3 (0bca07a), before launch 7
    runs = sorted(DOCS.glob("*/smollm2-S*-s*/run.json"))
    assert len(runs) == 12 + 12 + 2 + 12 + 1 + 12 + 12
    for path in runs:
        info = json.loads(path.read_text())
        after = {"launch4": amendment, "solo": amendment, "launch6": amendment2, "launch7": amendment3}.get(
            path.parts[-3], plan_committed
        )
        assert info["started"] > after and info["code"]["commit"], path
        if path.parts[-3] == "launch7":  # run from the amendment's commit, and resumed from it
            assert info["code"]["commit"].startswith("0bca07a") and len(info["resumes"]) == 2, path


def test_launch4_evaluated_no_step_after_0_in_every_run():
    """What the README's 'no arm-level test' rests on: PLAN.md's deviation step for launch 4 is step 0."""
    assert _bench().common_step(DOCS / "launch4") == 0


def test_the_primary_block_is_analysis_compare_seed_level_test(tmp_path):
    """The code that reports PLAN.md's primary once a launch gets there, on six seed pairs that did (the embedded
    seeds6 runs, renamed as a launch's): its table is compare's, the same numbers as the published report."""
    bench, seeds6 = _bench(), REPO / "docs/experiment-embedded/seeds6"
    seeds6 = unpack(seeds6, tmp_path / "seeds6")  # rows out of rows.tar.xz
    for arm in bench.ARMS:
        for seed in bench.SEEDS:
            shutil.copytree(seeds6 / f"runs/{arm}-s{seed}", tmp_path / f"smollm2-{arm}-s{seed}")
    assert bench.common_step(tmp_path) == 10
    block = bench.primary_block(tmp_path)
    published = (seeds6 / "S2_vs_S0/report.md").read_text()
    primary = next(line for line in published.splitlines() if line.startswith("| heldout300 (primary) |"))
    assert (
        "step 10, PLAN.md's deviation step, seeds 0, 1, 2, 3, 4, 5" in block and primary in block.splitlines()
    )
    assert "Sensitivity" not in block  # no run failed there
    table = bench.arm_trajectory(tmp_path).splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == ["| 0", "| 5", "| 10"]


def test_launch6_leaves_the_failed_runs_seed_out_and_compares_at_step_20():
    """PLAN.md's rules on launch 6's rows: S0-s1 logged a NaN gradient norm at step 12 (a failed run), so seed 1's
    pair leaves the seed-level test; the other ten runs all evaluated step 20; all twelve, step 10."""
    bench, launch = _bench(), DOCS / "launch6"
    assert [r.name for r in sorted(launch.glob("smollm2-*")) if r.is_dir() and bench.failed(r)] == [
        "smollm2-S0-s1"
    ]
    assert bench.tested_seeds(launch) == (0, 2, 3, 4, 5)
    assert bench.common_step(launch, (0, 2, 3, 4, 5)) == 20 and bench.common_step(launch) == 10
    block = bench.primary_block(launch)
    assert "### Primary: S2 − S0, heldout300, step 20, PLAN.md's deviation step, seeds 0, 2, 3, 4, 5" in block
    assert "### Sensitivity, every seed (not the primary): S2 − S0, heldout300, step 10" in block


def test_launch7_tests_every_seed_at_step_30_and_its_skipped_updates_are_not_failures():
    """PLAN.md amendment 3 on launch 7's rows: every run reached step 30; S2-s5's steps 11 and 12 had a NaN
    gradient norm with finite micro-batch losses and applied no update, so no run failed and all six seed
    pairs enter the primary at the plan's step 30 (no deviation, no sensitivity reading)."""
    bench, launch = _bench(), DOCS / "launch7"
    assert not any(bench.failed(r) for r in launch.glob("smollm2-*") if r.is_dir())
    assert bench.tested_seeds(launch) == bench.SEEDS and bench.common_step(launch) == 30
    rows = read_jsonl(launch / "smollm2-S2-s5/results/steps.jsonl")
    assert [r["step"] for r in rows if r["update_skipped"]] == [11, 12]
    assert all(r["nonfinite_losses"] == 0 for r in rows)
    block = bench.primary_block(launch)
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
    real_experiment = _bench()
    monkeypatch.setattr(real_experiment, "gpu_memory_mib", lambda pid: (9000.0, 143771.0))
    assert real_experiment.fitting(12, 1) == 12  # 0.9 x 143771 / 9000 = 14.4: all twelve fit
    monkeypatch.setattr(real_experiment, "gpu_memory_mib", lambda pid: (15000.0, 143771.0))
    assert real_experiment.fitting(12, 1) == 8
    monkeypatch.setattr(real_experiment, "gpu_memory_mib", lambda pid: (200000.0, 143771.0))
    assert real_experiment.fitting(12, 1) == 1  # never none
    monkeypatch.setattr(real_experiment, "gpu_memory_mib", lambda pid: None)  # no nvidia-smi: as asked
    assert real_experiment.fitting(5, 1) == 5
