"""docs/experiment-real/: every number of its README recomputes from the committed rows."""

import json
from pathlib import Path

from analysis.compare import main as compare_main

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
        rows = [json.loads(line) for line in (DOCS / "base" / name).read_text().splitlines()]
        assert [bench.at_cap(rows, k["cap"]) for k in cell["caps"]] == cell["caps"]
    choice = json.loads((DOCS / "base/choice.json").read_text())
    assert bench.choose(report["cells"]) == {k: v for k, v in choice.items() if k != "snapshot_sha256"}


def test_every_run_started_after_the_plan_was_committed():
    plan_committed = (
        "2026-12-01T20:46:17Z"  # git log -1 --format=%cI -- docs/experiment-real/PLAN.md (cd2081e)
    )
    amendment = "2026-12-02T00:03:27Z"  # amendment 1 (9e99860), before launch 4
    runs = sorted(DOCS.glob("*/smollm2-S*-s*/run.json"))
    assert len(runs) == 12 + 12 + 2 + 12
    for path in runs:
        info = json.loads(path.read_text())
        after = amendment if path.parts[-3] == "launch4" else plan_committed
        assert info["started"] > after and info["code"]["commit"], path


def test_the_launch4_primary_is_what_analysis_compare_computes_from_the_rows(tmp_path):
    """PLAN.md's primary: analysis.compare on the committed rows, against the README's headline table."""
    from analysis.compare import compare_runs

    bench = _bench()
    where = DOCS / "launch4"
    step = bench.common_step(where)
    runs = {arm: [where / f"smollm2-{arm}-s{s}" for s in bench.SEEDS] for arm in bench.ARMS}
    c = compare_runs(runs["S2"], runs["S0"], tmp_path, step_a=step, step_b=step, primary="heldout300")
    held = c.seed_level["heldout300"]
    readme = (DOCS / "README.md").read_text()
    line = next(row for row in readme.splitlines() if row.startswith("| heldout300 (primary) |"))
    cells = [x.strip() for x in line.strip("|").split("|")]
    assert cells[1] == ", ".join(f"{d:+.1f}" for d in held.diffs_pp)
    assert cells[2] == f"{held.mean:+.1f}" and cells[5] == held.test.p_text()


def test_the_seed0_comparison_recomputes(tmp_path):
    a, b = DOCS / "runs/smollm2-S2-s0", DOCS / "runs/smollm2-S0-s0"
    assert compare_main([str(a), str(b), "--a-step", "10", "--b-step", "10", "--out", str(tmp_path)]) == 0

    def tables(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith(("| heldout300", "| fixed32", "| B "))]

    assert tables((tmp_path / "report.md").read_text()) == tables((DOCS / "seed0/report.md").read_text())
