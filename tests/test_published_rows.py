"""Every published report (docs/experiment-*/**/report.md) has its rows committed beside it, and its tables
are what analysis.compare computes from those rows (issue 28; analysis.published, `make check-docs`)."""

import shutil
from pathlib import Path

import pytest

from analysis.published import (
    PublishedError,
    missing_rows,
    published_reports,
    read_report,
    recompute,
    table_rows,
)
from rundir.archive import unpack

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "docs/experiment-h200/result/comparisons/S2_vs_S0/report.md"


def _reports() -> list:
    return [pytest.param(r, id=str(r.relative_to(ROOT / "docs"))) for r in published_reports(ROOT / "docs")]


def test_the_h200_report_is_published_with_its_rows():
    assert H200 in published_reports(ROOT / "docs")
    pub = read_report(H200)
    assert pub.recorded == (["/tmp/capgrpo-h200/runs/S2"], ["/tmp/capgrpo-h200/runs/S0"])
    assert pub.steps == (40, 40) and pub.evaluated[0] == list(range(0, 41, 5)) and pub.primary == "heldout300"
    assert missing_rows(H200) == []


@pytest.mark.parametrize("report", _reports())
def test_every_published_report_has_its_rows(report):
    assert missing_rows(report) == []


@pytest.mark.parametrize("report", _reports())
def test_every_published_report_recomputes_from_its_rows(report, tmp_path):
    committed, recomputed = recompute(report, tmp_path)
    assert any("(primary)" in row for row in committed)
    assert recomputed == committed


def test_missing_rows_are_named_file_by_file(tmp_path):
    docs = tmp_path / "docs"
    exp = docs / "experiment-x"
    plain = unpack(ROOT / "docs/experiment-h200/result", tmp_path / "plain")  # rows out of rows.tar.xz
    shutil.copytree(plain / "runs/S2", exp / "runs/S2")
    shutil.copytree(plain / "runs/S0", exp / "runs/S0")
    (exp / "cmp").mkdir()
    shutil.copy(H200, exp / "cmp/report.md")
    assert published_reports(docs) == [exp / "cmp/report.md"] and missing_rows(exp / "cmp/report.md") == []
    (exp / "runs/S0/results/steps.jsonl").unlink()
    (exp / "runs/S2/results/eval_step035.jsonl").unlink()
    assert missing_rows(exp / "cmp/report.md") == [
        f"{exp / 'cmp/report.md'}: run /tmp/capgrpo-h200/runs/S2: {exp / 'runs/S2/results/eval_step035.jsonl'} "
        "is not committed",
        f"{exp / 'cmp/report.md'}: run /tmp/capgrpo-h200/runs/S0: {exp / 'runs/S0/results/steps.jsonl'} "
        "is not committed",
    ]
    shutil.rmtree(exp / "runs/S0")
    assert (
        f"run /tmp/capgrpo-h200/runs/S0: no single committed folder {exp}/**/runs/S0"
        in missing_rows(exp / "cmp/report.md")[-1]
    )
    with pytest.raises(PublishedError, match="is not committed"):
        recompute(exp / "cmp/report.md", tmp_path / "out")


def test_check_docs_cli_exits_1_naming_each_missing_file(tmp_path, capsys):
    from analysis.published import main

    exp = tmp_path / "docs/experiment-y/cmp"
    exp.mkdir(parents=True)
    shutil.copy(H200, exp / "report.md")
    assert main([str(tmp_path / "docs")]) == 1
    captured = capsys.readouterr()
    assert "runs/S2: no single committed folder" in captured.err and "1 published report(s)" in captured.out
    (exp / "report.md").write_text("# no tables\n")
    assert main([str(tmp_path / "docs")]) == 1
    assert "no 'run directory' row" in capsys.readouterr().err


def test_the_seeds6_plan_reports_its_published_report_byte_for_byte_as_the_readme_quotes_it():
    """The launcher's report stage of docs/experiment-embedded/seeds6/plan.yaml is S2_vs_S0/report.md, byte for
    byte, from the committed rows; README.md's embedded table quotes its seed-level rows."""
    from launch.plan import load
    from launch.report import report as launch_report

    report = ROOT / "docs/experiment-embedded/seeds6/S2_vs_S0/report.md"
    text = launch_report(load(ROOT / "docs/experiment-embedded/seeds6/plan.yaml"))
    assert text == report.read_text()
    committed = table_rows(text)
    readme = (ROOT / "README.md").read_text()
    for set_name in ("heldout300 (primary)", "fixed32"):
        row = next(r for r in committed if r.startswith(f"| {set_name} | +") and "of 6" in r)
        cells = [c.strip() for c in row.strip("|").split("|")]
        per_seed, mean, sd, p = cells[1], cells[2], cells[3], cells[5]
        assert per_seed in readme and f"{mean} pp ({sd})" in readme, set_name
        assert f"p = {float(p):.3f}" in readme, (set_name, p)
