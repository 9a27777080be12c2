"""launch/settings.py: a run's settings are one mapping of trainer config fields, checked when the plan loads, and
one command line. Every committed plan, whose run_args are the first plans' `--flag value` strings, still starts
its runs with the command line the launcher built before run_args were typed: tests/launch_argv_7ef36d5.json.xz holds
what that launcher (commit 7ef36d5) started for every run of every committed plan, fresh, on the GPU and in --smoke.
"""

import json
import lzma
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import launch.runs as runs
import launch.settings as settings
from launch.plan import ROOT, PlanError, load
from launch.settings import argv, plan_settings, render

PINNED = json.loads(
    lzma.decompress((ROOT / "tests/launch_argv_7ef36d5.json.xz").read_bytes())
)  # 219 KB plain
COMMITTED = subprocess.run(
    ["git", "ls-files", "docs/**/plan*.yaml"], cwd=ROOT, capture_output=True, text=True
)


class Started:
    """A trainer process that has finished at once, exit 0."""

    pid = 1

    def __init__(self, cmd):
        self.cmd, self.returncode = cmd, 0

    def poll(self):
        return 0

    def wait(self):
        return 0


def started_commands(path: str, smoke: bool, work: Path, monkeypatch) -> list[list[str]]:
    """Every trainer command line `train` starts for the plan's runs, fresh, with the base and snapshot stubbed."""
    plan = replace(load(ROOT / path), status="final")  # a draft's command line too
    (work / "base").mkdir(parents=True)
    (work / "base/tiny_base.json").write_text("{}")
    started, real_popen = [], subprocess.Popen

    def popen(cmd, **kw):  # nvidia-smi and the like run; the trainer is recorded
        if "trainer.train" not in cmd:
            return real_popen(cmd, **kw)
        started.append(cmd)
        return Started(cmd)

    def build_base(plan, work, model, smoke, gguf=None):
        return ROOT / "embedded/base" if smoke else work / (model or plan.base.get("model") or "base")

    def write_tasks(plan, work, name):
        return json.loads((ROOT / plan.results / "base/base_report.json").read_text())["choice"][
            "snapshot_sha256"
        ]

    monkeypatch.setattr(settings, "build_base", build_base)
    monkeypatch.setattr(settings, "write_tasks", write_tasks)
    monkeypatch.setattr(runs.subprocess, "Popen", popen)
    monkeypatch.setattr(runs, "pack", lambda *a: None)
    monkeypatch.setattr(runs, "gpu_devices", lambda n, smoke: [None])
    monkeypatch.setattr(runs, "start_mps", lambda work: {})
    monkeypatch.setattr(runs, "stop_mps", lambda env: None)
    monkeypatch.setattr(runs.time, "sleep", lambda s: None)
    runs.train(plan, work, work / "out", smoke, budget_s=10**6, parallel=100)
    subs = (
        (sys.executable, "<PY>"),
        (str(work), "<WORK>"),
        (str(ROOT), "<ROOT>"),
    )  # the venv may be under ROOT
    return [[a.replace(*subs[0]).replace(*subs[1]).replace(*subs[2]) for a in cmd] for cmd in started]


def flags(cmd: list[str]) -> dict[str, list[str]]:
    """A trainer command line as the parser reads it: each flag's values, the last occurrence winning."""
    out, flag = {}, None
    for a in cmd[3:]:
        if a.startswith("--"):
            flag = a
            out[flag] = []
        else:
            out[flag].append(a)
    return out


def test_every_committed_plan_is_pinned():
    """Every plan written in the first form (run_args as flag lists: those registered before typed plans) has the
    command lines the old launcher started pinned; plans written since use the mapping form throughout."""
    first_form = [p for p in COMMITTED.stdout.split()
                  if any(isinstance(v, list) for v in (yaml.safe_load((ROOT / p).read_text()).get("run_args") or {}).values())]  # fmt: skip
    assert sorted(PINNED) == sorted(first_form)


@pytest.mark.parametrize("mode", ["gpu", "smoke"])
@pytest.mark.parametrize("path", sorted(PINNED))
def test_every_committed_plan_starts_its_runs_with_the_command_line_it_did(path, mode, tmp_path, monkeypatch):
    new = started_commands(path, mode == "smoke", tmp_path / "w", monkeypatch)
    old = PINNED[path][mode]
    assert [flags(c) for c in new] == [flags(c) for c in old]
    for cmd in new:  # one flag once: the mapping's
        named = [a for a in cmd if a.startswith("--")]
        assert len(named) == len(set(named)), cmd
    if mode == "gpu":  # no flag given twice before either: the very same command line
        assert new == old


def test_old_argument_lists_and_typed_mappings_are_the_same_settings():
    listed = ["--max_steps", "2", "--bf16", "false", "--dtype", "float32", "--report_to", "none",
              "--checkpoint_steps", "2", "--gpu_memory_share", "0.45"]  # fmt: skip
    typed = {"max_steps": 2, "bf16": False, "dtype": "float32", "report_to": "none", "checkpoint_steps": [2],
             "gpu_memory_share": 0.45}  # fmt: skip
    assert plan_settings(listed, "p") == plan_settings(typed, "p") == typed
    assert argv({"eval_every": 1, "eval_at_steps": [0, 10, 30], "use_cpu": True})[3:] == [
        "--eval_every", "1", "--eval_at_steps", "0", "10", "30", "--use_cpu", "true"]  # fmt: skip
    assert render(0.45) == ["0.45"] and render(False) == ["false"]


def test_typed_settings_parse_as_the_trainer_parses_them():
    """What `argv` renders, the trainer's own parser reads back as the plan's values (nargs lists, bools, and bools
    that default to true, which the parser also offers as `--no_<field>`)."""
    from transformers import HfArgumentParser
    from trl import ModelConfig

    from trainer.config import CapGRPOConfig

    typed = {"max_steps": 3, "eval_every": 1, "eval_at_steps": [0, 2, 3], "checkpoint_steps": [1, 3],
             "bf16": False, "use_cpu": True, "gpu_memory_share": 0.5, "output_dir": "/tmp/x", "arm": "S0",
             "model_name_or_path": "embedded/base", "deterministic_fill_memory": False,
             "deterministic_kv_writes": True}  # fmt: skip
    parsed = HfArgumentParser((CapGRPOConfig, ModelConfig)).parse_args(argv(plan_settings(typed, "p"))[3:])
    assert {k: getattr(parsed, k) for k in typed} == typed


@pytest.mark.parametrize(
    "run_args, says",
    [({"gpu": {"max_stepz": 3}}, "run_args.gpu: unknown field 'max_stepz'"),
     ({"smoke": ["--max_stepz", "3"]}, "run_args.smoke: unknown field 'max_stepz'"),
     ({"gpu": {"max_steps": "3"}}, "run_args.gpu.max_steps: '3' is a str, the field's type is int"),
     ({"gpu": {"max_steps": 2.5}}, "run_args.gpu.max_steps: 2.5 is not a valid int"),
     ({"gpu": {"bf16": "maybe"}}, "run_args.gpu.bf16: 'maybe' is not a valid bool"),
     ({"gpu": {"bf16": "false"}}, "run_args.gpu.bf16: 'false' is a str, the field's type is bool"),
     ({"gpu": {"eval_at_steps": 5}}, "run_args.gpu.eval_at_steps: expected a list, got 5"),
     ({"gpu": {"max_steps": [3]}}, "run_args.gpu.max_steps: expected one value, got [3]"),
     ({"gpu": {"nonfinite_gradient": "skipp"}}, "run_args.gpu.nonfinite_gradient: 'skipp' is not one of stop, skip"),
     ({"gpu": {"max_steps": None}}, "run_args.gpu.max_steps: None is not a command-line value"),
     ({"smoke": ["--max_steps", "1", "--max_steps", "2"]}, "run_args.smoke: --max_steps appears twice"),
     ({"smoke": ["max_steps", "1"]}, "run_args.smoke: an argument list is --flag value pairs"),
     ({"cpu": {}}, "run_args: unknown field 'cpu'"),
     ({"gpu": {"max_steps": {"a": 1}}}, "run_args.gpu.max_steps: {'a': 1} is not a command-line value"),
     ({"gpu": {"eval_set_files": {"m": None}}}, "run_args.gpu.eval_set_files: {'m': None} is not a mapping")],
    ids=["unknown", "unknown-listed", "str-for-int", "float-for-int", "bool", "quoted-bool", "not-a-list", "a-list", "choices",
         "null", "twice", "not-a-flag", "mode", "mapping-for-int", "mapping-of-null"],
)  # fmt: skip
def test_a_run_arg_the_trainer_would_refuse_is_refused_when_the_plan_loads(run_args, says, tmp_path):
    raw = yaml.safe_load((ROOT / "docs/experiment-real/plan.yaml").read_text())
    raw["run_args"] = run_args
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(PlanError) as e:
        load(path)
    assert str(e.value).startswith(f"{path}: {says}"), str(e.value)
