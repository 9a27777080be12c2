"""launch/ (issue 45): the plan reader's refusals, the base report's rule, the draft guard, and the base stage at
CPU sizes with the shipped tiny embedded base."""

import json
import tarfile
from pathlib import Path

import pytest

from launch.__main__ import main as launch_main
from launch.base import at_cap, choose
from launch.plan import PlanError, Rule, load

ROOT = Path(__file__).resolve().parent.parent
PLANS = ["docs/experiment-real/plan.yaml", "docs/experiment-h200/plan.yaml", "docs/experiment-qwen/plan.yaml"]


@pytest.mark.parametrize("path", PLANS)
def test_every_committed_plan_loads_and_names_its_runs(path):
    plan = load(ROOT / path)
    assert plan.arms[0] == "S0" and plan.primary["set"] in plan.eval["sets"]
    names = [n for arm in plan.arms for n, _ in plan.runs(arm)]
    assert len(set(names)) == len(names) == len(plan.arms) * len(plan.seeds or [None])


def test_the_qwen_plan_has_eight_seeds_30_steps_and_the_issue_rule():
    plan = load(ROOT / "docs/experiment-qwen/plan.yaml")
    assert plan.status == "final" and len(plan.seeds) >= 8 and plan.steps >= 30 and plan.eval["every"] == 5
    assert plan.primary["set"] == "heldout300" and plan.primary["step"] == 30
    # pass@1 floor 0.20 as registered, 0.15 since amendment 1 (PLAN.md, before any training run)
    assert (plan.base_report.rule.truncated, plan.base_report.rule.pass_at_1) == ((0.15, 0.35), (0.15, 0.70))


def _plan_with(tmp_path, edit) -> Path:
    import yaml

    raw = yaml.safe_load((ROOT / PLANS[0]).read_text())
    edit(raw)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_an_unknown_field_is_refused_with_one_line_naming_the_file_and_field(tmp_path):
    path = _plan_with(tmp_path, lambda r: r.update(sedes=[0, 1]))
    with pytest.raises(PlanError, match=rf"{path}: unknown field 'sedes'"):
        load(path)
    path = _plan_with(tmp_path, lambda r: r["base_report"]["rule"].update(min_gaet=0.3))
    with pytest.raises(PlanError, match=rf"{path}: base_report.rule: unknown field 'min_gaet'"):
        load(path)
    path = _plan_with(tmp_path, lambda r: r["primary"].update(set="heldout"))
    with pytest.raises(PlanError, match="primary.set 'heldout' is not one of eval.sets"):
        load(path)
    assert launch_main([str(path), "report"]) == 1
    path = _plan_with(tmp_path, lambda r: r["report"].append({"kind": "primray"}))
    with pytest.raises(PlanError, match=r"report\[15\].kind 'primray' is not one of primary, "):
        load(path)


def test_train_refuses_a_draft_plan(tmp_path, capsys):
    plan = _plan_with(tmp_path, lambda r: r.update(status="draft"))
    assert launch_main([str(plan), "train", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]) == 1
    assert "status draft" in capsys.readouterr().err and not (tmp_path / "w").exists()


def _rows(outcomes_by_task: dict[str, list[tuple[str, int]]]) -> list[dict]:
    return [
        {"task_id": t, "outcome": o, "completion_tokens": n}
        for t, xs in outcomes_by_task.items()
        for o, n in xs
    ]


def test_a_smaller_cap_reads_longer_completions_as_truncated():
    rows = _rows({"a": [("correct", 10), ("wrong", 50)], "b": [("correct", 40), ("truncated", 64)]})
    assert at_cap(rows, 64)["truncated"] == 0.25 and at_cap(rows, 64)["gate_v1"] == 0.5
    k = at_cap(rows, 32)
    assert k["truncated"] == 0.75 and k["pass@1"] == 0.25 and k["gate_v1"] == 0.0 and k["mixed"] == 0.5


def _cell(tasks, temperature, caps, **extra):
    keys = ("cap", "truncated", "pass@1", "gate_v1", "mixed")
    return {"tasks": tasks, "temperature": temperature, **extra, "caps": [dict(zip(keys, c)) for c in caps]}


def test_the_rule_takes_the_smallest_cap_in_band_then_the_largest_gate_share():
    rule = Rule(candidates={"prompt": "p"}, truncated=(0.15, 0.35), pass_at_1=(0.2, 0.7), min_gate=0.3)
    cells = [
        _cell(
            "g",
            0.7,
            [(256, 0.5, 0.3, 0.6, 0.6), (384, 0.3, 0.4, 0.4, 0.5), (512, 0.2, 0.5, 0.9, 0.9)],
            prompt="p",
        ),
        _cell("g", 1.0, [(256, 0.2, 0.3, 0.5, 0.5)], prompt="p"),
        _cell("m", 0.7, [(256, 0.2, 0.3, 0.99, 0.99)], prompt="other"),  # not a candidate
    ]
    chosen = choose(cells, rule)
    assert (chosen["tasks"], chosen["temperature"], chosen["cap"], chosen["fallback"]) == (
        "g",
        1.0,
        256,
        False,
    )
    # T 0.7's cap is 384 (the smallest in band), not 512 with its larger gate share
    cells[1]["caps"][0]["gate_v1"] = 0.4
    assert choose(cells, rule)["temperature"] == 0.7 and choose(cells, rule)["cap"] == 384
    # nothing eligible and no fallback: the experiment is not run
    with pytest.raises(SystemExit, match="no candidate cell meets the plan's rule"):
        choose(cells, Rule(candidates={"prompt": "p"}, truncated=(0.15, 0.35), pass_at_1=(0.6, 0.7)))


def test_the_base_stage_at_cpu_sizes_writes_the_report_the_choice_and_an_archive_without_weights(tmp_path):
    work, out = tmp_path / "w", tmp_path / "out"
    assert launch_main([PLANS[0], "base", "--smoke", "--work", str(work), "--out", str(out)]) == 0
    report = json.loads((work / "base_report.json").read_text())
    assert [(c["tasks"], c["prompt"], c["temperature"]) for c in report["cells"]] == [
        (c["tasks"], c["prompt"], c["temperature"]) for c in load(ROOT / PLANS[0]).base_report.cells
    ]
    for cell in report["cells"]:  # every cap's row recomputes from the cell's committed rows
        name = f"base_rows_{cell['tasks']}_{cell['prompt']}_T{cell['temperature']}.jsonl"
        rows = [json.loads(x) for x in (work / name).read_text().splitlines()]
        assert len(rows) == 4 and [at_cap(rows, k["cap"]) for k in cell["caps"]] == cell["caps"]
    assert (
        json.loads((out / "choice.json").read_text())["snapshot_sha256"]
        == report["choice"]["snapshot_sha256"]
    )
    assert len(list(out.iterdir())) <= 8
    with tarfile.open(out / "smollm2.tar.gz") as tar:
        names = tar.getnames()
    assert "smollm2/base_report.md" in names and not [
        n for n in names if n.endswith((".safetensors", ".tasks.json"))
    ]


def test_disk_fit_holds_every_stopped_runs_save(tmp_path):
    from launch.runs import disk_fit

    base = tmp_path / "base"
    base.mkdir()
    with (base / "model.safetensors").open("wb") as f:  # sparse: its size, not its blocks, sets a save's size
        f.truncate(2**40)
    assert disk_fit(6, tmp_path, base) == 1  # 3.5 TiB a save: one run at a time, never none
    with (base / "model.safetensors").open("wb") as f:
        f.truncate(1024)
    assert disk_fit(6, tmp_path, base) == 6
    (base / "model.safetensors").unlink()
    assert disk_fit(6, tmp_path, base) == 6  # no safetensors: nothing to estimate from, the plan's number


def test_train_runs_only_the_seeds_asked_and_refuses_seeds_not_in_the_plan(tmp_path, capsys):
    work, out = tmp_path / "w", tmp_path / "o"
    assert (
        launch_main([PLANS[1], "train", "--smoke", "--seeds", "1", "--work", str(work), "--out", str(out)])
        == 1
    )
    assert "--seeds [1]: not among" in capsys.readouterr().err  # the H200 plan has one run per arm, no seeds
    assert launch_main([PLANS[0], "base", "--smoke", "--work", str(work), "--out", str(out)]) == 0
    assert (
        launch_main([PLANS[0], "train", "--smoke", "--seeds", "5", "--work", str(work), "--out", str(out)])
        == 0
    )
    assert sorted(p.name for p in (work / "runs").iterdir() if p.is_dir()) == [
        "smollm2-S0-s5",
        "smollm2-S2-s5",
    ]
