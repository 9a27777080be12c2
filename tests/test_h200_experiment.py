"""docs/experiment-h200/plan.yaml through the launcher (issue 20, issue 45): the H200 recipe's base settings,
the base check, the throughput summary, the committed report recomputed, and (slow) the whole pipeline at CPU
sizes with --smoke."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from embedded.build import BuildConfig, _overrides, build_model, build_tokenizer
from launch.__main__ import main as launch_main
from launch.plan import load
from launch.report import report, throughput_of

ROOT = Path(__file__).resolve().parent.parent
PLAN = load(ROOT / "docs/experiment-h200/plan.yaml")


def test_the_base_settings_build_a_tens_of_millions_qwen35_with_the_hybrid_pattern():
    cfg = BuildConfig(**_overrides([], str(ROOT / PLAN.base["overrides"])))
    model = build_model(cfg, build_tokenizer(cfg))
    text = model.config.text_config
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    assert 10e6 < model.num_parameters() < 100e6
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"
    ]
    assert sum(text.rope_parameters["mrope_section"]) * 2 == text.head_dim // 2  # rotary on half of each head
    # the recipe's cap is one the warm start's re-check loops outrun, and sequences hold prompt + cap
    assert cfg.sft_max_length > yaml.safe_load((ROOT / PLAN.recipe).read_text())["max_completion_length"] + 79


def test_an_overrides_file_with_an_unknown_field_is_refused_by_name(tmp_path):
    bad = tmp_path / "base.json"
    bad.write_text(json.dumps({"hidden_size": 64, "hiden_layers": 3}))
    with pytest.raises(SystemExit, match=r"base\.json: hiden_layers.*no field 'hiden_layers'"):
        _overrides([], str(bad))
    with pytest.raises(SystemExit, match=r"--set 'hidden=96': BuildConfig has no field 'hidden'"):
        _overrides(["hidden=96"])
    assert _overrides(["hidden_size=96"], None) == {"hidden_size": 96}


def test_added_fields_at_their_defaults_keep_the_shipped_hash():
    shipped = json.loads((ROOT / "embedded/base/tiny_base.json").read_text())
    assert BuildConfig().digest() == shipped["config_hash"]
    assert BuildConfig(head_dim=64).digest() != BuildConfig().digest()


def test_train_refuses_a_work_folder_without_the_base(tmp_path, capsys):
    plan = ROOT / "docs/experiment-h200/plan.yaml"
    assert (
        launch_main([str(plan), "train", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "out")]) == 1
    )
    err = capsys.readouterr().err
    assert str(tmp_path / "w" / "base") in err and "run the base stage first" in err


def test_the_launcher_runs_from_the_repo_root_without_the_editable_install(tmp_path):
    # the device runs `python3 -m launch PLAN train` in an uninstalled snapshot with PYTHONPATH holding only the
    # wheels: take this venv's editable install off the path, and `train` must reach its own refusal
    boot = (
        "import importlib.util, runpy, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]\n"
        f"sys.path[:] = [p for p in sys.path if p not in ('', {str(ROOT)!r}) and '__editable__' not in p]\n"
        "assert importlib.util.find_spec('launch') is None, 'the repo is still importable'\n"
        "sys.path.insert(0, '')\n"  # what `python -m` does: the working directory first
        f"sys.argv = ['launch', 'docs/experiment-h200/plan.yaml', 'train', '--work', {str(tmp_path / 'w')!r}, "
        f"'--out', {str(tmp_path / 'out')!r}]\n"
        "runpy.run_module('launch', run_name='__main__', alter_sys=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", boot], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "ModuleNotFoundError" not in proc.stderr and "the repo is still importable" not in proc.stderr
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"error: {tmp_path / 'w' / 'base'}: no complete build" in proc.stderr


def test_throughput_from_steps_jsonl(tmp_path):
    rows = [
        {"seconds": {"generate": 10.0, "grade": 1.0, "train": 4.0, "eval": 5.0, "save": 0.0, "grade_lost": 0.5},
         "outcomes_sampled": {"correct": 300, "truncated": 212}, "completion_length": {"mean": 100.0},
         "tokens_trained": 20000, "groups": {"rounds": 1, "sampled": 64, "trained": 32}},
        {"seconds": {"generate": 2.0, "grade": 1.0, "train": 2.0, "eval": 0.0, "save": 0.0},
         "outcomes_sampled": {"correct": 512}, "completion_length": {"mean": 50.0},
         "tokens_trained": 10000, "groups": {"rounds": 2, "sampled": 128, "trained": 32}},
    ]  # fmt: skip
    (tmp_path / "results").mkdir()
    (tmp_path / "results/steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = throughput_of(tmp_path)
    a, w = t["all"], t["warm"]
    assert a["steps"] == 2 and a["seconds"]["step_total"] == 25.0  # grade_lost is inside grade
    assert a["steps_per_s"] == pytest.approx(2 / 25)
    assert a["generated_tokens"] == 512 * 100 + 512 * 50
    assert a["generated_tokens_per_s_of_generation"] == pytest.approx(76800 / 12)
    assert a["generation_share"] == pytest.approx(12 / 25)
    assert a["generation_share_without_eval"] == pytest.approx(12 / 20)
    assert a["trained_tokens_per_s_of_train_time"] == pytest.approx(30000 / 6)
    assert a["sampled_per_trained_group"] == pytest.approx(192 / 64)
    assert w["steps"] == 1 and w["generation_share"] == pytest.approx(2 / 5)


def test_the_committed_h200_result_recreates_its_report_from_the_committed_runs(tmp_path):
    # issue 20: the report and its inputs are in the repo; the inputs alone (run.json, steps.jsonl, eval
    # files, no weights) must give the same numbers as the report the device wrote
    result = ROOT / "docs/experiment-h200/result"
    cmd = [sys.executable, "-m", "analysis.compare", str(result / "runs/S2"), str(result / "runs/S0")]
    proc = subprocess.run([*cmd, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]

    def numbers(report: str) -> list[str]:  # every table row but the run directories (device paths)
        return [line for line in report.splitlines() if line.startswith("|") and "run directory" not in line]

    committed = (result / "comparisons/S2_vs_S0/report.md").read_text()
    assert "| heldout300 (primary) | 64.7% (194/300) | 65.3% (196/300) | -0.7 |" in committed
    assert numbers((tmp_path / "report.md").read_text()) == numbers(committed)


def test_the_plan_report_recomputes_the_committed_comparison_and_throughput():
    # the launcher's report stage from the plan alone: compare's report (but the device's run paths) and the
    # throughput rows of the summary the device wrote
    text = report(PLAN)
    committed = (ROOT / "docs/experiment-h200/result/comparisons/S2_vs_S0/report.md").read_text()

    def numbers(report: str) -> list[str]:
        return [line for line in report.splitlines() if line.startswith("|") and "run directory" not in line]

    compared, throughput = text.split("### Throughput", 1)
    assert numbers(compared) == numbers(committed)
    summary = (ROOT / "docs/experiment-h200/result/summary.md").read_text()
    rows = [line.split(" | ", 1)[1] for line in summary.splitlines() if line.startswith(("| S0 (", "| S2 ("))]
    assert len(rows) == 4 and rows == [
        line.split(" | ", 1)[1] for line in throughput.splitlines() if line.startswith(("| S0 (", "| S2 ("))
    ]


@pytest.mark.slow
def test_smoke_run_trains_both_arms_resumably_and_packs_without_weights(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    plan = str(ROOT / "docs/experiment-h200/plan.yaml")
    for stage in ("base", "train"):
        cmd = [sys.executable, "-m", "launch", plan, stage, "--smoke", "--work", str(work), "--out", str(out)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(list(out.iterdir())) <= 8  # what the device machine returns
    with tarfile.open(out / "h200.tar.xz") as tar:
        names = tar.getnames()
        steps = {
            arm: [json.loads(x) for x in tar.extractfile(f"h200/runs/{arm}/results/steps.jsonl")]
            for arm in PLAN.arms
        }
    assert not [n for n in names if n.endswith(".safetensors")]
    for arm in PLAN.arms:
        assert [r["step"] for r in steps[arm]] == [1, 2]
        assert {f"h200/runs/{arm}/results/eval_step00{s}.jsonl" for s in (0, 1, 2)} <= set(names)
    # a second train call finds every run finished and starts none
    again = subprocess.run([sys.executable, "-m", "launch", plan, "train", "--smoke", "--work", str(work), "--out",
                            str(out)], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0 and "started" not in again.stdout and "2 of 2 runs at step 2" in again.stdout
    text = subprocess.run([sys.executable, "-m", "launch", plan, "report", "--results", str(work / "runs")], cwd=ROOT,
                          capture_output=True, text=True).stdout  # fmt: skip
    assert "### Primary: S2 − S0, heldout300, step 2, PLAN.md's deviation step" in text
    assert "| S0 outcome | S0 → S2 correct |" in text
