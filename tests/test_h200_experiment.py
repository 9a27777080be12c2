"""bench/h200_experiment.py (issue 20): the H200 recipe's base settings, the base check, the throughput
summary, and (slow) the whole pipeline at CPU sizes with --smoke."""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from embedded.build import BuildConfig, _overrides, build_model, build_tokenizer

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("h200_experiment", ROOT / "bench/h200_experiment.py")
h200 = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(h200)


def test_the_base_settings_build_a_tens_of_millions_qwen35_with_the_hybrid_pattern():
    cfg = BuildConfig(**_overrides([], str(h200.BASE_OVERRIDES)))
    model = build_model(cfg, build_tokenizer(cfg))
    text = model.config.text_config
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    assert 10e6 < model.num_parameters() < 100e6
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"
    ]
    assert sum(text.rope_parameters["mrope_section"]) * 2 == text.head_dim // 2  # rotary on half of each head
    # the recipe's cap is one the warm start's re-check loops outrun, and sequences hold prompt + cap
    assert cfg.sft_max_length > yaml.safe_load(h200.RECIPE.read_text())["max_completion_length"] + 79


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
    assert h200.main(["train", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "w" / "base") in err and "run `base` first" in err


def test_the_script_run_as_a_file_imports_the_repo_without_it_on_the_path(tmp_path):
    # the device runs `python3 bench/h200_experiment.py train` in an uninstalled snapshot with PYTHONPATH
    # holding only the wheels: take this venv's editable install and the repo root off the path, run the
    # file from elsewhere, and `train` must reach its own refusal, not a ModuleNotFoundError
    script, work = ROOT / "bench/h200_experiment.py", tmp_path / "w"
    boot = (
        "import importlib.util, runpy, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]\n"
        f"sys.path[:] = [p for p in sys.path if p not in ('', {str(ROOT)!r}) and '__editable__' not in p]\n"
        "assert importlib.util.find_spec('embedded') is None, 'the repo is still importable'\n"
        f"sys.argv = [{str(script)!r}, 'train', '--work', {str(work)!r}, '--out', {str(tmp_path / 'out')!r}]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", boot], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "ModuleNotFoundError" not in proc.stderr and "the repo is still importable" not in proc.stderr
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"error: {work / 'base'}: no complete build" in proc.stderr


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
    t = h200.throughput(tmp_path)
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


@pytest.mark.slow
def test_smoke_run_builds_trains_both_arms_compares_and_packs_without_weights(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "bench/h200_experiment.py"), "all", "--smoke"]
    proc = subprocess.run([*cmd, "--work", str(work), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and "h200-experiment.tar.gz" in files  # what the device machine returns
    manifest = json.loads((out / "tiny_base.json").read_text())
    assert manifest["config"]["layer_types"][3] == "full_attention" and manifest["config"]["sft_steps"] == 3
    assert json.loads((out / "base_report.json").read_text())["cap"] == h200.SMOKE_CAP
    with tarfile.open(out / "h200-experiment.tar.gz") as tar:
        names = tar.getnames()
        steps = {
            arm: [json.loads(x) for x in tar.extractfile(f"h200-experiment/runs/{arm}/results/steps.jsonl")]
            for arm in h200.ARMS
        }
    assert not [n for n in names if n.endswith(".safetensors")]
    assert "h200-experiment/comparisons/S2_vs_S0/report.md" in names
    for arm in h200.ARMS:
        assert [r["step"] for r in steps[arm]] == [1, 2]
        assert {f"h200-experiment/runs/{arm}/results/eval_step00{s}.jsonl" for s in (0, 1, 2)} <= set(names)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["compared_step"] == 2 and not summary["stopped"]
    s0 = summary["throughput"]["S0"]["all"]
    generate = sum(r["seconds"]["generate"] for r in steps["S0"])
    assert s0["generation_share"] == pytest.approx(generate / s0["seconds"]["step_total"], rel=1e-3)
